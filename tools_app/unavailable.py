"""When the database is unreachable: a classified answer with Retry-After, never a traceback.

PostgreSQL restarting (a failover, an upgrade, a crash) makes queries fail
with `OperationalError` or `InterfaceError` for a few seconds. Every entry
point answers that as "unavailable: come back after Retry-After", in its own
format:

- the admin, the API and the other Django views: HTTP 503 with Retry-After
  (`DatabaseUnavailableMiddleware`), JSON, or a short page for the admin;
- `/healthz`: 503 with Retry-After and the failed check (tools_app.health);
- `/mcp` (tools_app.mcp_server): 503 with Retry-After and a JSON-RPC error
  when the bearer token cannot be checked; a tool call that reached the
  engine answers an `isError` result of class `transient` with `retry_after`.

Nothing here reconnects: connections are persistent and health-checked
(CONN_MAX_AGE, CONN_HEALTH_CHECKS), so the first request after the restart
gets a fresh one.
"""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse

from tools_app.errors import Transient

logger = logging.getLogger(__name__)

DATABASE_ERRORS = (OperationalError, InterfaceError)
MESSAGE = ("the database is unavailable for a moment; retry after retry_after seconds "
           "(a write with the same idempotency_key: it runs at most once)")


def retry_after() -> float:
    return float(settings.IDEMOPS["UNAVAILABLE_RETRY_AFTER_SECONDS"])


def retry_after_header() -> str:
    """Retry-After takes whole seconds."""
    return str(max(1, math.ceil(retry_after())))


def transient() -> Transient:
    """The tool error for a call the outage interrupted."""
    return Transient(MESSAGE, retry_after=retry_after())


def error_body() -> dict:
    """The `error` object of a JSON answer, shaped like a tool call's error."""
    return {"class": "transient", "message": MESSAGE, "retry_after": retry_after()}


def log(where: str, exc: BaseException) -> None:
    # A warning, not a traceback per request: during an outage there are many.
    logger.warning("%s: database unavailable (%s: %s)", where, type(exc).__name__, str(exc).strip()[:200])


def response(request) -> HttpResponse:
    headers = {"Retry-After": retry_after_header()}
    if request.path.startswith(reverse("admin:index")):  # people read this one
        page = render_to_string("503.html", {"retry_after": retry_after_header()})
        return HttpResponse(page, status=503, headers=headers)
    return JsonResponse({"error": error_body()}, status=503, headers=headers)


class DatabaseUnavailableMiddleware:
    """A database error raised by a view becomes 503 + Retry-After instead of a 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, DATABASE_ERRORS):
            return None
        log(request.path, exception)
        return response(request)
