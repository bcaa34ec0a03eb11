"""POST /callbacks/payment-gateway: the payment gateway reports a payment's outcome itself.

A payment whose answer never reached us is UNKNOWN until someone finds out (the reconciler
asks the gateway on a schedule). A gateway that reports its payments settles such a record
at once. The report must be signed with the shared secret (IDEMOPS_PAYMENT_GATEWAY_CALLBACK_SECRET,
idemops_demo.tools.payments.verify_callback); the record moves through reconciliation's guarded
transitions, so a report that arrives late, twice, or after a reconciliation changes nothing.

Answers: 200 `settled` or `already final` (a duplicate: nothing changed); 409 with Retry-After
while the payment's executor is still waiting for the gateway's own answer (the gateway sends
the report again); 404 for a key we never sent; 403 for a missing or wrong signature; 400 for a
body that is not a callback.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from idemops.tools import CallbackVerdict, InvalidInput, PermissionDenied, settle_by_callback
from idemops_demo.tools import payments

ACTOR = "system:payment-gateway-callback"
IN_FLIGHT_RETRY_AFTER_SECONDS = 1

STATUS = {CallbackVerdict.SETTLED: 200, CallbackVerdict.ALREADY_FINAL: 200, CallbackVerdict.IN_FLIGHT: 409,
          CallbackVerdict.UNKNOWN_KEY: 404}


@csrf_exempt  # a server-to-server call, authenticated by its signature
@require_POST
def payment_gateway_callback(request: HttpRequest) -> JsonResponse:
    try:
        payload = payments.verify_callback(request.body, request.headers.get("Gateway-Signature", ""))
        key, answer = payments.callback_answer(payload)
    except PermissionDenied as refused:
        return JsonResponse({"error": refused.message}, status=403)
    except InvalidInput as invalid:
        return JsonResponse({"error": invalid.message}, status=400)
    verdict = settle_by_callback(key, answer, actor=ACTOR)
    response = JsonResponse({"outcome": verdict.value}, status=STATUS[verdict])
    if verdict == CallbackVerdict.IN_FLIGHT:
        response["Retry-After"] = str(IN_FLIGHT_RETRY_AFTER_SECONDS)
    return response
