"""Who is who, and who may do what: tenants, their agents' API tokens, auditor keys, the
operators' roles, and the one check every operator operation goes through (`authorize`).

May import: core.
"""

from tools_app.access.tenants import (
    Agent,
    Permit,
    audit_refusal,
    authenticate_token,
    authorize,
    create_tenant,
    issue_token,
    revoke_token,
    visible_tenant_ids,
)

__all__ = ["Agent", "Permit", "audit_refusal", "authenticate_token", "authorize", "create_tenant", "issue_token",
           "revoke_token", "visible_tenant_ids"]
