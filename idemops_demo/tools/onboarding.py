"""`onboard_customer`: a multi-service flow as a saga, on the long-task machinery.

create_customer (here) → request_mandate (the payment gateway, with an
idempotency key of this task's own) → send_welcome_email (through the outbox;
the step drives the delivery and is done once the email is delivered). A step that fails for good (the gateway refuses
the mandate; the email is dead-lettered) runs the compensations of the steps
before it in reverse order: cancel the mandate, close the customer. Each
compensation is a checkpointed step of its own and idempotent (cancelling a
cancelled mandate, closing a closed customer change nothing), so a worker
killed inside one runs it again and no further; then the task fails with the
error that started them, naming what was undone.

The saga needs no reconciliation of its own: every downstream request carries
the same key on every run (derived from the task's operation), so a request
whose answer was lost is simply sent again and the gateway answers what it did.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx2
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, Field

from idemops.tools import (
    InvalidInput,
    KeepFor,
    MessageStatus,
    Pipeline,
    Retention,
    RetryPolicy,
    Step,
    StepContext,
    Transient,
    UnknownOutcome,
    WriteInput,
    crash_point,
    downstream_request,
    enqueue_message,
    long_tool,
    relay_message,
)
from idemops_demo.idemops_settings import DemoSettings
from idemops_demo.models import Customer
from idemops_demo.tools.payments import gateway_url

# The id of a task's welcome email: the same on every run of the step, so it is written once.
WELCOME_NAMESPACE = uuid.UUID("5b0c3f61-6a8e-4b8e-9d3e-0e6f1a2c7d41")


class OnboardCustomerInput(WriteInput):
    name: str = Field(min_length=1, max_length=200)
    email: str = Field(min_length=3, max_length=254, description="Where the welcome email goes.")
    iban: str = Field(pattern=r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}$",
                      description="The account the payment mandate is for (IBAN, no spaces).")


class OnboardResult(BaseModel):
    customer_id: int
    mandate_id: str
    welcome_email_id: str = Field(description="The outbox event id of the welcome email (delivered).")
    status: str


def check_email(args: OnboardCustomerInput) -> None:
    try:
        validate_email(args.email)
    except ValidationError:
        raise InvalidInput("email: must be an email address") from None


def _mandate_key(ctx: StepContext[OnboardCustomerInput]) -> str:
    # The operation's id: one per onboarding, kept across retries and resumptions. (Not the record's
    # downstream_key: a long tool's start is transactional, its record has none, and every onboarding
    # would send the gateway the same key.)
    return f"{ctx.task.operation_id}.mandate"


def _gateway(method: str, path: str, **kwargs: Any) -> httpx2.Response:
    try:
        return downstream_request(method, gateway_url(path),
                                  timeout=DemoSettings.current().payment_gateway_timeout_seconds, **kwargs)
    except UnknownOutcome as exc:
        # Sent, answer lost: the same request with the same key again is safe (the gateway deduplicates).
        raise Transient(f"the payment gateway's answer was lost; asking again with the same key ({exc.message})"
                        ) from None


# --- the steps and their compensations -------------------------------------------------------------


def create_customer(ctx: StepContext[OnboardCustomerInput]) -> dict[str, Any]:
    args = ctx.arguments
    customer, _ = Customer.objects.get_or_create(task_id=ctx.task_id, defaults=dict(
        tenant_id=ctx.tenant_id, name=args.name, email=args.email, created_at=timezone.now()))
    return {"customer_id": customer.pk}


def close_customer(ctx: StepContext[OnboardCustomerInput]) -> dict[str, Any]:
    customer_id = ctx.outputs["create_customer"]["customer_id"]
    Customer.objects.filter(pk=customer_id, status=Customer.Status.ACTIVE).update(
        status=Customer.Status.CLOSED, closed_at=timezone.now())
    return {"customer_id": customer_id, "status": Customer.Status.CLOSED}


def request_mandate(ctx: StepContext[OnboardCustomerInput]) -> dict[str, Any]:
    args = ctx.arguments
    customer_id = ctx.outputs["create_customer"]["customer_id"]
    key = _mandate_key(ctx)
    response = _gateway("POST", "/mandates", json={"customer": f"{ctx.tenant_id}:{customer_id}", "iban": args.iban},
                        headers={"Idempotency-Key": key}, asked={"idempotency_key": key})
    mandate = response.json()
    Customer.objects.filter(pk=customer_id).update(mandate_id=mandate["mandate_id"])
    return {"mandate_id": mandate["mandate_id"], "status": mandate["status"]}


def cancel_mandate(ctx: StepContext[OnboardCustomerInput]) -> dict[str, Any]:
    mandate_id = ctx.outputs["request_mandate"]["mandate_id"]
    try:
        response = _gateway("POST", f"/mandates/{mandate_id}/cancel")
    except InvalidInput as exc:  # 404: nothing to cancel (what the gateway says is the truth)
        return {"mandate_id": mandate_id, "status": "not_found", "answer": exc.message[:200]}
    crash_point("in_compensation")
    return {"mandate_id": mandate_id, "status": response.json()["status"]}


def send_welcome_email(ctx: StepContext[OnboardCustomerInput]) -> dict[str, Any]:
    args = ctx.arguments
    event_id = uuid.uuid5(WELCOME_NAMESPACE, str(ctx.task_id))
    with transaction.atomic():
        event = enqueue_message(tenant_id=ctx.tenant_id, record=ctx.task.record, kind="notification.email",
                               event_id=event_id, payload={
                                   "recipient": args.email, "subject": f"Welcome, {args.name}",
                                   "body": f"Dear {args.name},\n\nyour account is ready.\n"})

    # Deliver it now rather than wait for the relay: it needs a worker, and this step holds one.
    relay_message(event.pk)
    event.refresh_from_db(fields=["status", "last_error", "attempts", "next_attempt_at"])
    if event.status == MessageStatus.DEAD:
        raise InvalidInput(f"the welcome email to {args.email} could not be delivered ({event.last_error}); "
                           "the onboarding is undone")
    if event.status != MessageStatus.DELIVERED:
        due_in = (event.next_attempt_at - timezone.now()).total_seconds()
        raise Transient(f"the welcome email is not delivered yet ({event.attempts} attempt(s): {event.last_error})",
                        retry_after=max(1.0, due_in))
    return OnboardResult(customer_id=ctx.outputs["create_customer"]["customer_id"],
                         mandate_id=ctx.outputs["request_mandate"]["mandate_id"], welcome_email_id=str(event.pk),
                         status="onboarded").model_dump()


ONBOARDING = Pipeline(
    steps=(
        Step("create_customer", create_customer, compensate=close_customer),
        Step("request_mandate", request_mandate, compensate=cancel_mandate),
        Step("send_welcome_email", send_welcome_email),
    ),
    # The email step retries as long as the outbox does (IDEMOPS_OUTBOX_MAX_ATTEMPTS), and then some.
    retry=RetryPolicy(max_attempts=12),
    validate=check_email,
)

long_tool(
    name="onboard_customer", title="Onboard a customer", input_model=OnboardCustomerInput,
    output_model=OnboardResult, pipeline=ONBOARDING, open_world=True, downstream="payment-gateway",
    # Who was onboarded with which mandate: the task's data is kept for a year, like payments' records.
    retention=Retention(keep=KeepFor(tasks=timedelta(days=365))),
    personal_fields=frozenset({"name", "email", "iban"}),
    description="Onboard a customer across services: create the customer, request a payment mandate from the "
                "payment gateway, send the welcome email. If a step fails for good (the bank refuses the mandate, "
                "the email cannot be delivered), the steps before it are undone in reverse order (mandate "
                "cancelled, customer closed) and the task fails saying what was undone. Runs as a durable task "
                "that resumes after a crash without repeating a step. Requires idempotency_key.",
)

