"""Sets `request.user.second_factor_at`: when this session last entered a second-factor code.

Runs after django-otp's OTPMiddleware (which sets `otp_device`), lazily like it: a request that never
looks at the user reads nothing. `tools_app.access.second_factor.fresh` reads it for step-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from tools_app.access import second_factor


class SecondFactorTimeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        # The stubs type request.user as a user; the lazy proxy stands in for one, as django-otp's does.
        request.user = SimpleLazyObject(lambda: self._with_time(request, user))  # type: ignore[assignment]
        return self.get_response(request)

    @staticmethod
    def _with_time(request: HttpRequest, user: Any) -> Any:
        at = second_factor.session_time(request.session) if second_factor.verified(user) else None
        user.second_factor_at = at
        return user
