"""`request_payment`: a write whose effect happens in the payment gateway.

The gateway gets the record's downstream key as its Idempotency-Key, so a
retry after a transient failure cannot pay twice, and the operation id
(X-Operation-Id), which it records with the payment. An answer that never came
back leaves the record UNKNOWN; `reconcile_payment` then asks the gateway
for the payment by that key, unless the gateway's signed callback (`verify_callback`,
`callback_answer`, received by idemops_demo.callbacks) reported it first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import timedelta
from decimal import Decimal
from typing import Annotated, Any

import httpx2
from pydantic import BaseModel, Field

from idemops.tools import (
    ApprovalPolicy,
    ConfirmationPolicy,
    ExpiryPolicy,
    Found,
    InvalidInput,
    KeepFor,
    NotDone,
    PermissionDenied,
    Reconciliation,
    Retention,
    SentCall,
    StillUnknown,
    Tenant,
    ToolContext,
    WriteInput,
    amount_policy,
    downstream_request,
    evidence_entry,
    traced_request,
    write_tool,
)
from idemops_demo.idemops_settings import DemoSettings


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
    return DemoSettings.current().payment_gateway_url.rstrip("/") + path


def _timeout() -> float:
    return DemoSettings.current().payment_gateway_timeout_seconds


def reconcile_payment(call: SentCall[RequestPaymentInput]) -> Found | NotDone | StillUnknown:
    """Ask the gateway whether a payment exists for the key we sent."""
    url = gateway_url("/payments")
    asked = {"method": "GET", "url": url, "idempotency_key": call.downstream_key}
    try:
        response = traced_request("GET", url, params={"idempotency_key": call.downstream_key}, timeout=_timeout())
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


def payment_for_reference(call: SentCall[RequestPaymentInput], payment_id: str) -> dict[str, Any]:
    """What an operator's "succeeded, payment <id>" resolves to: the gateway's own record of it, which must
    be the payment this call asked for (its amount and currency)."""
    response = traced_request("GET", gateway_url(f"/payments/{payment_id}"), timeout=_timeout())
    if response.status_code != 200:
        raise InvalidInput(f"the gateway has no payment {payment_id!r}")
    payment = PaymentOutput.model_validate(response.json())
    if (Decimal(payment.amount), payment.currency) != (call.args.amount, call.args.currency):
        raise InvalidInput(f"payment {payment_id!r} is of {payment.amount} {payment.currency}, not the "
                           f"{call.args.amount:.2f} {call.args.currency} this call asked for")
    return payment.model_dump()


# A callback signed longer ago than this is refused (a replayed capture of an old one).
CALLBACK_TOLERANCE_SECONDS = 300


def verify_callback(body: bytes, signature: str) -> dict[str, Any]:
    """The gateway's callback, if `signature` (its Gateway-Signature header: `t=<unix
    time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`) proves it comes from the gateway; else
    PermissionDenied. A body that is not a callback is InvalidInput."""
    secret = DemoSettings.current().payment_gateway_callback_secret.get_secret_value()
    if not secret:
        raise PermissionDenied("payment gateway callbacks are not enabled here")
    parts = dict(part.split("=", 1) for part in signature.split(",") if "=" in part)
    try:
        signed_at = int(parts["t"])
    except (KeyError, ValueError):
        raise PermissionDenied("Gateway-Signature: missing or malformed") from None
    expected = hmac.new(secret.encode(), f"{signed_at}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("v1", "")):
        raise PermissionDenied("Gateway-Signature: does not match")
    if abs(time.time() - signed_at) > CALLBACK_TOLERANCE_SECONDS:
        raise PermissionDenied("Gateway-Signature: signed too long ago")
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict) or not isinstance(payload.get("idempotency_key"), str):
            raise ValueError
    except ValueError:
        raise InvalidInput("a callback is a JSON object with idempotency_key and payment") from None
    return payload


def callback_answer(payload: dict[str, Any]) -> tuple[str, Found | NotDone]:
    """(the key we sent, what the gateway reports) of a verified callback."""
    try:
        payment = PaymentOutput.model_validate(payload.get("payment"))
    except ValueError:
        raise InvalidInput("payment: not a payment") from None
    evidence = evidence_entry("payment-gateway-callback", payment_id=payment.payment_id, status=payment.status)
    if payment.status == "succeeded":
        return payload["idempotency_key"], Found(payment.model_dump(), evidence)
    return payload["idempotency_key"], NotDone(f"the gateway reports the payment {payment.status}", evidence)


def payment_needs_approval(tenant: Tenant, args: RequestPaymentInput) -> ApprovalPolicy | None:
    """Above the tenant's payment threshold a person confirms (two people above the second one)."""
    return amount_policy(tenant, args.amount, args.currency,
                         summary=f"Pay {args.amount} {args.currency} to {args.payee}"
                                 + (f" (reference {args.reference})" if args.reference else ""))


def payment_is_confirmed(tenant: Tenant, args: RequestPaymentInput) -> ConfirmationPolicy | None:
    """Below the tenant's approval threshold no operator looks at it: the person behind the agent confirms."""
    if payment_needs_approval(tenant, args) is not None:
        return None
    return ConfirmationPolicy(summary=f"Pay {args.amount} {args.currency} to {args.payee}"
                                      + (f" (reference {args.reference})" if args.reference else ""))


@write_tool(name="request_payment", title="Request a payment", open_world=True, downstream="payment-gateway",
            reconciliation=Reconciliation(reconcile_payment, result_for_reference=payment_for_reference),
            approval=payment_needs_approval, requires_operation_id=True, confirmation=payment_is_confirmed,
            personal_fields=frozenset({"payee", "reference"}),
            # The gateway's payment id (from the result) and the currency: what an operator is quoted in an
            # incident (the caller's own reference may name a person, so it is not searchable).
            search_fields=frozenset({"payment_id", "currency"}),
            # A payment key is never silently reused after its retention; what was paid, to whom, stays
            # readable for a year (the setting's 30 days are for the rest).
            retention=Retention(on_expiry=ExpiryPolicy.HOLD, keep=KeepFor(records=timedelta(days=365))))
def request_payment(ctx: ToolContext, args: RequestPaymentInput) -> PaymentOutput:
    """Ask the payment gateway to pay `amount` `currency` to `payee`. Its idempotency_key must be an operation_id
    from prepare_operation (any other key is refused as invalid_input); every retry with it returns the same
    payment. At or below the tenant's approval threshold the person behind the agent confirms it (their host
    asks them); above it the answer is
    `pending_approval` until a person confirms; call again with the same key to learn the outcome. If the
    answer is `unknown_outcome`, the payment is being reconciled: do not retry with a new key; calling again
    with the same key is safe and answers the reconciled outcome once it is known. `downstream_conflict`: the
    gateway holds this key for another payment; an operator must check, so neither retry nor use a new key."""
    body = {"amount": str(args.amount), "currency": args.currency, "payee": args.payee,
            "reference": args.reference}
    response = downstream_request(
        "POST", gateway_url("/payments"), json=body, timeout=_timeout(),
        headers={"Idempotency-Key": ctx.downstream_key, OPERATION_ID_HEADER: ctx.operation_id},
        asked={"idempotency_key": ctx.downstream_key, "operation_id": ctx.operation_id,
               "amount": body["amount"], "currency": args.currency})
    return PaymentOutput.model_validate(response.json())
