"""The demo tenant, its people and its agent token, which `make run` creates once.

- `admin`: a superuser, and the owner of the demo agent's token. Four eyes: the owner cannot
  approve what the agent asks for, so the demo has a second person:
- `alice`: approver of the demo tenant, with an email address: she is told (through the outbox, to
  the notification sink) when the agent asks for an approval.

Both are enrolled with an authenticator (TOTP); the banner prints each secret and otpauth URI, since
every change in the console needs a code.

Credentials are kept in var/demo-credentials.json (mode 0600) so that every
`make run` can print them; the token itself is stored hashed in the database
like any other.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction

from tools_app import access
from tools_app.access import roles, second_factor
from tools_app.access.models import ApiToken, Tenant
from tools_app.approvals.models import ApprovalSettings
from tools_app.conf import conf

DEMO_TENANT = "demo"
DEMO_ADMIN = "admin"
DEMO_APPROVER = "alice"
DEMO_STEP_UP_AMOUNT = 2000


def credentials_path() -> Path:
    return conf().var_dir / "demo-credentials.json"


@transaction.atomic
def ensure_demo() -> dict[str, str]:
    path = credentials_path()
    saved = json.loads(path.read_text()) if path.exists() else {}
    tenant = Tenant.objects.filter(slug=DEMO_TENANT).first()
    if tenant is None:
        tenant = access.create_tenant(DEMO_TENANT, "Demo tenant", actor="system:demo")
        # So the demo shows approvals: payments above 1,000 EUR wait for a person, above 10,000 for two, and
        # approving one above 2,000 (the banner's 2,500) asks for a fresh authenticator code (step-up).
        ApprovalSettings.objects.create(tenant=tenant, payment_threshold=1000, payment_second_threshold=10000,
                                        step_up_amount=DEMO_STEP_UP_AMOUNT)
    User = get_user_model()
    admin = User.objects.filter(username=DEMO_ADMIN).first()
    if admin is None:
        saved["admin_password"] = secrets.token_urlsafe(12)
        admin = User.objects.create_superuser(DEMO_ADMIN, "admin@example.invalid", saved["admin_password"])
    if not User.objects.filter(username=DEMO_APPROVER).exists():
        saved["approver_password"] = secrets.token_urlsafe(12)
        approver = User.objects.create_user(DEMO_APPROVER, "alice@example.invalid", saved["approver_password"])
        roles.grant(approver, roles.APPROVER, [DEMO_TENANT], actor="system:demo")
    token = access.authenticate_token(saved["token"]) if saved.get("token") else None
    if token is None:
        # First run, or the saved token was revoked or belongs to another database.
        name = f"demo-agent-{ApiToken.objects.filter(tenant=tenant).count() + 1}"
        _, saved["token"] = access.issue_token(tenant, name, owner=admin, actor="system:demo")
    elif token.owner_id is None:  # issued by a release from before tokens had owners
        access.set_owner(token, admin, actor="system:demo", reason="the demo agent's owner")
    saved["admin_user"], saved["approver_user"] = DEMO_ADMIN, DEMO_APPROVER
    # Both enrolled with an authenticator: every change in the console needs its code (access.second_factor).
    for role, person in (("admin", admin), ("approver", User.objects.get(username=DEMO_APPROVER))):
        device = second_factor.totp_device(person) or second_factor.enrol(person, actor="system:demo",
                                                                          confirmed=True)
        saved[f"{role}_totp_secret"] = second_factor.base32_secret(device)
        saved[f"{role}_otpauth_uri"] = device.config_url
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=2))
    path.chmod(0o600)
    return saved
