"""GET /metrics: the platform's figures in the Prometheus text format (tools_app.metrics.prometheus).

Who may scrape: a client whose address is in IDEMOPS_METRICS_ALLOWED_NETWORKS (by default this
machine only), or one presenting IDEMOPS_METRICS_TOKEN as `Authorization: Bearer <token>`.
Anyone else gets 403, or 401 if they presented a wrong token. The address is the connection's
peer (REMOTE_ADDR): behind a proxy, give the scraper the token instead of widening the networks.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from tools_app.conf import conf
from tools_app.metrics import prometheus


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _from_allowed_network(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(network) for network in conf().metrics_allowed_networks)


def refusal(request: HttpRequest) -> JsonResponse | None:
    """None if `request` may scrape; else the answer saying why not."""
    presented, token = _bearer(request), conf().metrics_token
    if presented is not None:
        if token is not None and hmac.compare_digest(presented.encode(), token.get_secret_value().encode()):
            return None
        return JsonResponse({"error": {"class": "permission_denied", "message": "wrong metrics token"}}, status=401,
                            headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    if _from_allowed_network(request):
        return None
    return JsonResponse({"error": {"class": "permission_denied", "message": (
        "this address may not scrape /metrics: present IDEMOPS_METRICS_TOKEN as a bearer token, or add the "
        "address to IDEMOPS_METRICS_ALLOWED_NETWORKS")}}, status=403)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if (refused := refusal(request)) is not None:
        return refused
    body, content_type = prometheus.exposition(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)
