"""The Django side of a database outage: a view's database error becomes 503 + Retry-After
(core.outage says what every entry point answers)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse

from tools_app.core import outage


def response(request: HttpRequest) -> HttpResponse:
    headers = {"Retry-After": outage.retry_after_header()}
    if request.path.startswith(reverse("admin:index")):  # people read this one
        page = render_to_string("503.html", {"retry_after": outage.retry_after_header()})
        return HttpResponse(page, status=503, headers=headers)
    return JsonResponse({"error": outage.error_body()}, status=503, headers=headers)


class DatabaseUnavailableMiddleware:
    """A database error raised by a view becomes 503 + Retry-After instead of a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, outage.DATABASE_ERRORS):
            return None
        outage.log(request.path, exception)
        return response(request)
