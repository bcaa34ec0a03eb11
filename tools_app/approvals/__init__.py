"""Human approval of sensitive operations: a call waits for a person, then runs once.

A tool is sensitive when its declaration has an `approval` rule (a function of
the tenant and the validated arguments returning a toolkit.policies.ApprovalPolicy,
or None to run at once). `gate.py` diverts such a call into an ApprovalRequest
bound to its idempotency record and answers the callers while it waits;
`decisions.py` is what approvers do (four eyes: never the requester, never the
owner of the agent that asked); `notices.py` tells the approvers (through the
outbox) and escalates requests that wait too long; `execution.py` runs an
approved operation through the same record (so it runs once), and ends
requests that expired; `jobs.py` the django-q2 entry points; `thresholds.py` a
tenant's thresholds, changed behind their own Permit. The engine learns of
approvals only through the hooks registered in tools_app.apps.

May import: core, access, engine, toolkit, outbox.
"""

from tools_app.approvals.decisions import APPROVE, DECIDE_PERMISSION, REJECT, approve, reject
from tools_app.approvals.execution import (
    APPROVAL_SWEEPER,
    REDRIVE_AFTER,
    abandon,
    approved_operation,
    dispatch,
    expire,
    redrive,
    settle,
)
from tools_app.approvals.gate import (
    APPROVED_RETRY_AFTER,
    PENDING_RETRY_AFTER,
    amount_policy,
    approval_info,
    follow,
    gate,
    pending_error,
    request_approval,
    status_for_agent,
    tenant_settings,
)
from tools_app.approvals.jobs import escalate, run_approved, sweep
from tools_app.approvals.notices import announce, approvers_of, due_for_escalation, escalate_due, link
from tools_app.approvals.thresholds import CHANGE_SETTINGS, save_settings

__all__ = [
    "APPROVE", "APPROVED_RETRY_AFTER", "CHANGE_SETTINGS", "DECIDE_PERMISSION", "PENDING_RETRY_AFTER", "REDRIVE_AFTER",
    "REJECT", "APPROVAL_SWEEPER", "abandon", "amount_policy", "announce", "approval_info", "approve",
    "approved_operation", "approvers_of", "dispatch", "due_for_escalation", "escalate", "escalate_due", "expire",
    "follow", "gate", "link", "pending_error", "redrive", "reject", "request_approval", "run_approved",
    "save_settings", "settle", "status_for_agent", "sweep", "tenant_settings",
]
