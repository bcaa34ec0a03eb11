"""The demo tenant, operator and token that `make run` creates once.

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

from idemops.conf import conf
from tools_app import access
from tools_app.access.models import ApiToken, Tenant
from tools_app.approvals.models import ApprovalSettings

DEMO_TENANT = "demo"
DEMO_ADMIN = "admin"


def credentials_path() -> Path:
    return conf().var_dir / "demo-credentials.json"


@transaction.atomic
def ensure_demo() -> dict[str, str]:
    path = credentials_path()
    saved = json.loads(path.read_text()) if path.exists() else {}
    tenant = Tenant.objects.filter(slug=DEMO_TENANT).first()
    if tenant is None:
        tenant = access.create_tenant(DEMO_TENANT, "Demo tenant", actor="system:demo")
        # So the demo shows approvals: payments above 1,000 EUR wait for a person, above 10,000 for two.
        ApprovalSettings.objects.create(tenant=tenant, payment_threshold=1000, payment_second_threshold=10000)
    if not saved.get("token") or access.authenticate_token(saved["token"]) is None:
        # First run, or the saved token was revoked or belongs to another database.
        name = f"demo-agent-{ApiToken.objects.filter(tenant=tenant).count() + 1}"
        _, saved["token"] = access.issue_token(tenant, name, actor="system:demo")
    User = get_user_model()
    if not User.objects.filter(username=DEMO_ADMIN).exists():
        saved["admin_password"] = secrets.token_urlsafe(12)
        User.objects.create_superuser(DEMO_ADMIN, "admin@example.invalid", saved["admin_password"])
    saved["admin_user"] = DEMO_ADMIN
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=2))
    path.chmod(0o600)
    return saved
