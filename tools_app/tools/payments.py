"""`request_payment`: a write whose effect happens in the payment gateway.

The gateway gets the record's downstream key as its Idempotency-Key, so a
retry after a transient failure cannot pay twice, and the operation id
(X-Operation-Id), which it records with the payment. An answer that never came
back leaves the record UNKNOWN; `reconcile_payment` then asks the gateway
for the payment by that key.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import httpx2
from pydantic import BaseModel, Field

from idemops.conf import conf
from tools_app.approvals import amount_policy
from tools_app.core import tracing
from tools_app.core.errors import InvalidInput
from tools_app.engine import ExpiryPolicy, evidence_entry
from tools_app.toolkit import downstream
from tools_app.toolkit.policies import ApprovalPolicy, Found, NotDone, StillUnknown
from tools_app.toolkit.registry import ToolContext, WriteInput, write_tool


class RequestPaymentInput(WriteInput):
    amount: Annotated[Decimal, Field(gt=0, max_digits=12, decimal_places=2)]
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. EUR")
    payee: str = Field(min_length=1, max_length=200)
    reference: str = Field("", max_length=200, description="Your reference, shown on the payment")


class PaymentOutput(BaseModel):
    payment_id: str
    status: str
    amount: str
    currency: str
    payee: str
    reference: str
    created_at: str


# Beside the Idempotency-Key (derived from it, for deduplication): the operation's id itself, so the
# gateway's record of the payment names the same operation as ours, the agent's and the audit log.
OPERATION_ID_HEADER = "X-Operation-Id"


def gateway_url(path: str) -> str:
    return conf().payment_gateway_url.rstrip("/") + path


def _timeout() -> float:
    return conf().payment_gateway_timeout_seconds


def reconcile_payment(record) -> Found | NotDone | StillUnknown:
    """Ask the gateway whether a payment exists for the key we sent."""
    url = gateway_url("/payments")
    asked = {"method": "GET", "url": url, "idempotency_key": record.downstream_key}
    try:
        response = tracing.request("GET", url, params={"idempotency_key": record.downstream_key}, timeout=_timeout())
    except httpx2.TransportError as exc:
        return StillUnknown(evidence_entry("reconciler", asked=asked, error=type(exc).__name__))
    answer = {"status": response.status_code, "body": response.text[:500]}
    if response.status_code == 200:
        return Found(PaymentOutput.model_validate(response.json()).model_dump(),
                     evidence_entry("reconciler", asked=asked, answer=answer))
    if response.status_code == 404:
        return NotDone("the gateway has no payment for this key",
                       evidence_entry("reconciler", asked=asked, answer=answer))
    return StillUnknown(evidence_entry("reconciler", asked=asked, answer=answer))


def payment_for_reference(record, payment_id: str) -> dict:
    """What an operator's "succeeded, payment <id>" resolves to: the gateway's own record of it."""
    response = tracing.request("GET", gateway_url(f"/payments/{payment_id}"), timeout=_timeout())
    if response.status_code != 200:
        raise InvalidInput(f"the gateway has no payment {payment_id!r}")
    return PaymentOutput.model_validate(response.json()).model_dump()


def payment_needs_approval(tenant, args: RequestPaymentInput) -> ApprovalPolicy | None:
    """Above the tenant's payment threshold a person confirms (two people above the second one)."""
    return amount_policy(tenant, args.amount, args.currency,
                         summary=f"Pay {args.amount} {args.currency} to {args.payee}"
                                 + (f" (reference {args.reference})" if args.reference else ""))


@write_tool(name="request_payment", title="Request a payment", input_model=RequestPaymentInput,
            output_model=PaymentOutput, transactional=False, open_world=True,
            reconciler=reconcile_payment, result_for_reference=payment_for_reference,
            approval=payment_needs_approval, requires_operation_id=True,
            personal_fields=frozenset({"payee", "reference"}),
            # A payment key is never silently reused after its retention.
            on_expiry=ExpiryPolicy.HOLD)
def request_payment(ctx: ToolContext, args: RequestPaymentInput) -> PaymentOutput:
    """Ask the payment gateway to pay `amount` `currency` to `payee`. Its idempotency_key must be an operation_id
    from prepare_operation (any other key is refused as invalid_input); every retry with it returns the same
    payment. Above the tenant's approval threshold the answer is
    `pending_approval` until a person confirms; call again with the same key to learn the outcome. If the
    answer is `unknown_outcome`, the payment is being reconciled: do not retry with a new key; calling again
    with the same key is safe and answers the reconciled outcome once it is known. `downstream_conflict`: the
    gateway holds this key for another payment; an operator must check, so neither retry nor use a new key."""
    body = {"amount": str(args.amount), "currency": args.currency, "payee": args.payee,
            "reference": args.reference}
    response = downstream.request(
        "POST", gateway_url("/payments"), json=body, timeout=_timeout(),
        headers={"Idempotency-Key": ctx.record.downstream_key, OPERATION_ID_HEADER: str(ctx.record.operation_id)},
        asked={"idempotency_key": ctx.record.downstream_key, "operation_id": str(ctx.record.operation_id),
               "amount": body["amount"], "currency": args.currency})
    return PaymentOutput.model_validate(response.json())
