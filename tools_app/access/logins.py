"""Console logins in the audit log: each failed attempt, and each lockout (django-axes counts the
failures per user and address and refuses the login once IDEMOPS_LOGIN_FAILURE_LIMIT is reached).

The attempted username is what someone typed, not a person known to have acted, so the actor is
`anonymous` and the name and address are in the event's `after`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from tools_app.core import audit

ANONYMOUS = "anonymous"


def _address(request: Any) -> str:
    return str(getattr(request, "axes_ip_address", None) or getattr(request, "META", {}).get("REMOTE_ADDR", ""))


def _record(action: str, username: str, request: Any) -> None:
    with transaction.atomic():
        audit.record_event(action=action, obj=get_user_model(), actor=ANONYMOUS, tenant_id=None,
                           after={"username": str(username)[:150], "address": _address(request)})


def login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """django.contrib.auth's user_login_failed (the password is never read from `credentials`)."""
    _record("login.failed", credentials.get("username", ""), request)


def locked_out(sender: Any, request: Any, username: str, ip_address: str, **kwargs: Any) -> None:
    """django-axes's user_locked_out."""
    _record("login.locked_out", username, request)


def connect() -> None:
    from axes.signals import user_locked_out
    from django.contrib.auth.signals import user_logged_in, user_login_failed

    from tools_app.access import second_factor

    user_login_failed.connect(login_failed, dispatch_uid="idemops-login-failed")
    user_locked_out.connect(locked_out, dispatch_uid="idemops-login-locked-out")
    user_logged_in.connect(second_factor.note_login, dispatch_uid="idemops-second-factor-login")
