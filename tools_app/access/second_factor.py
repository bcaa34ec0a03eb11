"""People's second factor: TOTP devices (django-otp), when a session verified one, and step-up.

A console session is verified when its person entered a code of one of their confirmed devices
(at login, or on the console's second-factor page): django-otp's middleware then sets
`user.otp_device` on every request of that session, and `SecondFactorTimeMiddleware`
(tools_app/web/second_factor.py) sets `user.second_factor_at`, when the session last entered a code
(by the database's clock, tools_app.core.clock, as step-up's freshness is judged: any web host may read it).
`authorize` refuses every operator operation to a person whose `otp_device` is None
(`verified`), and an approval above the tenant's step-up amount needs `fresh` too.

A user object read outside a request (a command's `--user`) carries no device: such a caller is
refused unless the command vouches for it with `at_the_shell` (whoever runs a command on the
server is already trusted with the server).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import transaction
from django_otp import login as otp_login
from django_otp import user_has_device
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from tools_app.core import audit, clock
from tools_app.core.errors import PermissionDenied, Refused

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
    from django.http import HttpRequest

_U = TypeVar("_U", bound="AbstractBaseUser")

# When this session last entered a second-factor code (an ISO time), beside django-otp's device id.
VERIFIED_AT_SESSION_KEY = "idemops_second_factor_at"
RECOVERY_CODES = 10


class SecondFactorRequired(PermissionDenied):
    """A person whose session has not entered a second-factor code asked for an operator operation."""


class StaleSecondFactor(Refused):
    """The operation needs a second-factor code entered more recently than this session's (step-up)."""


class _Shell:
    """The device of a person acting through a command on the server (see `at_the_shell`)."""

    persistent_id = "shell"


SHELL = _Shell()


def verified(who: Any) -> bool:
    """Whether `who` (a request's user) comes with a verified second factor."""
    return getattr(who, "otp_device", None) is not None


def verified_at(who: Any) -> datetime | None:
    """When `who`'s session last entered a second-factor code (None: never, or not a session)."""
    return getattr(who, "second_factor_at", None) if verified(who) else None


def fresh(who: Any, minutes: float) -> bool:
    """Whether `who`'s session entered a second-factor code within the last `minutes`."""
    if getattr(who, "otp_device", None) is SHELL:
        return True
    at = verified_at(who)
    # The database's clock, as when the code was entered (`remember`): a session verified on one web host
    # and used on another, whose clocks disagree, is neither stale at once nor fresh for hours.
    return at is not None and clock.read() - at <= timedelta(minutes=minutes)


def at_the_shell(user: _U) -> _U:
    """`user` acting through a command run on the server: treated as verified now."""
    user.otp_device = SHELL  # type: ignore[attr-defined]  # django-otp's attribute, set on the instance
    user.second_factor_at = clock.read()  # type: ignore[attr-defined]  # likewise ours
    return user


def session_time(session: Any) -> datetime | None:
    value = session.get(VERIFIED_AT_SESSION_KEY)
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def remember(request: HttpRequest, device: Any) -> None:
    """The session entered a valid code of `device` now: verified, and fresh for step-up."""
    otp_login(request, device)
    now = clock.read()
    request.session[VERIFIED_AT_SESSION_KEY] = now.isoformat()
    request.user.otp_device = device  # type: ignore[union-attr]  # django-otp's attribute
    request.user.second_factor_at = now  # type: ignore[union-attr]  # ours (SecondFactorTimeMiddleware)


def has_device(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether `user` has any confirmed second-factor device (authenticator, recovery codes, passkey)."""
    return user.is_authenticated and user_has_device(user, confirmed=True)


def may_enrol(user: Any) -> bool:
    """Whether `user`'s session may add a device (an authenticator, a passkey): only a session that proved
    a device already, or a person who has none yet. Else a stolen password would add the thief's device."""
    return verified(user) or not has_device(user)


def totp_device(user: AbstractBaseUser | AnonymousUser, *, confirmed: bool | None = True) -> TOTPDevice | None:
    if not user.is_authenticated:
        return None
    devices = TOTPDevice.objects.filter(user_id=user.pk).order_by("pk")
    if confirmed is not None:
        devices = devices.filter(confirmed=confirmed)
    return devices.first()


def check_code(user: AbstractBaseUser, code: str) -> Any | None:
    """The confirmed device (authenticator or recovery code) that `code` is valid for, or None.
    A TOTP code is accepted once (django-otp remembers the last step used); a recovery code is spent."""
    code = "".join(code.split())
    if not code:
        return None
    for model in (TOTPDevice, StaticDevice):
        for device in model.objects.filter(user_id=user.pk, confirmed=True).order_by("pk"):
            with transaction.atomic():  # django-otp's throttling counts failures on the device row
                if device.verify_token(code):  # refused while throttled after failures
                    return device
    return None


@transaction.atomic
def enrol(user: User, *, actor: str, confirmed: bool) -> TOTPDevice:
    """A new authenticator for `user`; confirmed at once (the demo, tests) or on the first valid code."""
    device = TOTPDevice.objects.create(user=user, name="authenticator", confirmed=confirmed)
    if confirmed:
        audit.record_event(action="second_factor.enrolled", obj=user, actor=actor, tenant_id=None,
                           after={"user": user.get_username(), "device": "totp"})
    return device


@transaction.atomic
def confirm(device: TOTPDevice, *, actor: str) -> list[str]:
    """Confirm a new authenticator (its first code was valid); returns fresh recovery codes, shown once."""
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    audit.record_event(action="second_factor.enrolled", obj=device.user, actor=actor, tenant_id=None,
                       after={"user": device.user.get_username(), "device": "totp"})
    return recovery_codes(device.user, actor=actor)


@transaction.atomic
def recovery_codes(user: User, *, actor: str) -> list[str]:
    """New single-use recovery codes for `user` (the old ones stop working), shown once."""
    static, _ = StaticDevice.objects.get_or_create(user=user, name="recovery codes", defaults={"confirmed": True})
    static.token_set.all().delete()
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create([StaticToken(device=static, token=code) for code in codes])
    audit.record_event(action="second_factor.recovery_codes_issued", obj=user, actor=actor, tenant_id=None,
                       after={"user": user.get_username(), "codes": len(codes)})
    return codes


def base32_secret(device: TOTPDevice) -> str:
    """The secret as authenticator apps take it typed in."""
    from base64 import b32encode

    return b32encode(device.bin_key).decode()


def audit_failed_code(user: AbstractBaseUser) -> None:
    with transaction.atomic():
        audit.record_event(action="second_factor.code_refused", obj=user, actor=audit.user_actor(user),
                           tenant_id=None, after={"user": user.get_username()})


def note_login(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    """user_logged_in: a login that carried a valid code makes the session fresh for step-up too."""
    if verified(user) and request is not None:
        request.session[VERIFIED_AT_SESSION_KEY] = clock.read().isoformat()
