"""Who is who, and who may do what: tenants, their agents' API tokens, auditor keys, the
operators' roles, the one check every operator operation goes through (`authorize`) and the
one tenant filter of everything shown (`scope`).

- `tenants.py`: tenants.
- `tokens.py`: agents' API tokens and their owners (four eyes); `auditors.py`: auditor keys and
  who an auditor is; both are bearer secrets issued, checked and revoked by `secrets.py`.
- `authorization.py`: Permit, Agent, `authorize`, `audit_refusal`, `visible_tenant_ids`, `scope`.
- `roles.py`: the operators' roles (Django groups).
- `second_factor.py`: people's second factor (django-otp): which session entered a code and when,
  enrolment, recovery codes, step-up freshness; `authorize` refuses a person without one.
- `oauth.py`: agents by OAuth 2.1 (django-oauth-toolkit): a person's consent (AgentConnection), its
  tokens at /mcp, their audit events, dynamic registration's limit, client metadata documents.
- `logins.py`: failed console logins and lockouts (django-axes) as audit events.
- `limits.py`: per-tenant limits (calls per minute, unfinished tasks per agent), enforced in the database.
- `webhook_secrets.py`: each tenant's webhook signing secret (sealed, shown once, rotated with an overlap).

May import: core.
"""

from tools_app.access.authorization import Agent, Permit, audit_refusal, authorize, scope, visible_tenant_ids
from tools_app.access.limits import (
    CHANGE_LIMITS,
    CallLimits,
    admit_call,
    admit_task,
    call_limits,
    change_limits,
    oauth_call_limits,
)
from tools_app.access.tenants import create_tenant
from tools_app.access.tokens import (
    TOKEN_PREFIX,
    authenticate_token,
    cached_token,
    issue_token,
    owner_id_of,
    revoke_token,
    set_owner,
)
from tools_app.access.webhook_secrets import ROTATE as ROTATE_WEBHOOK_SECRET
from tools_app.access.webhook_secrets import rotate as rotate_webhook_secret
from tools_app.access.webhook_secrets import signing_secrets

__all__ = ["CHANGE_LIMITS", "ROTATE_WEBHOOK_SECRET", "TOKEN_PREFIX", "Agent", "CallLimits", "Permit", "admit_call",
           "admit_task", "audit_refusal", "authenticate_token", "authorize", "cached_token", "call_limits",
           "change_limits", "create_tenant", "issue_token", "oauth_call_limits", "owner_id_of", "revoke_token",
           "rotate_webhook_secret", "scope", "set_owner", "signing_secrets", "visible_tenant_ids"]
