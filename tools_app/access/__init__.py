"""Who is who, and who may do what: tenants, their agents' API tokens, auditor keys, the
operators' roles, the one check every operator operation goes through (`authorize`) and the
one tenant filter of everything shown (`scope`).

- `tenants.py`: tenants.
- `tokens.py`: agents' API tokens; `auditors.py`: auditor keys and who an auditor is; both are
  bearer secrets issued, checked and revoked by `secrets.py`.
- `authorization.py`: Permit, Agent, `authorize`, `audit_refusal`, `visible_tenant_ids`, `scope`.
- `roles.py`: the operators' roles (Django groups).

May import: core.
"""

from tools_app.access.authorization import Agent, Permit, audit_refusal, authorize, scope, visible_tenant_ids
from tools_app.access.tenants import create_tenant
from tools_app.access.tokens import authenticate_token, cached_token, issue_token, revoke_token

__all__ = ["Agent", "Permit", "audit_refusal", "authenticate_token", "authorize", "cached_token", "create_tenant",
           "issue_token", "revoke_token", "scope", "visible_tenant_ids"]
