"""Retention tiers and the purge: how long what calls leave behind is kept, and its removal after.

The platform's three kinds, each kept for a time counted from when it finished: `records` (an
idempotency record's arguments and result), `tasks` (a task's arguments, result and answers) and
`artifacts` (a task's checkpoints, step batches and artifacts). An app adds its own kinds with
`register_retained` (the objects it keeps, their purge, and their default period from its own
settings). The time comes from, first to last: the tenant's RetentionOverride for the tool, the
tenant's override for every tool, the tool's declaration (`ToolSpec.keep`), the
IDEMOPS_RETENTION_<KIND>_HOURS setting or the app kind's default (`policy.py`).

`purge.py` removes what is past it, in batches taken with SELECT ... FOR UPDATE
SKIP LOCKED, each batch with one audit event per purged object in its
transaction; rows that are evidence (records, tasks) stay, emptied, and with a
record go the copies of its call's words: its raw key, its evidence's bodies,
its approval request's arguments and personal summary, its outbox payloads. Audit events
follow their own policy (AuditRetention, per tenant, audited): `audit_archive.py` moves an
expired prefix of the chain to a file, so what is kept still verifies from the archived head. `jobs.py` is the django-q2
entry point, scheduled in tools_app/schedules.py; `manage.py purge_expired`
runs it now.

May import: core, access, engine, toolkit, outbox, approvals, tasks.
"""

from tools_app.retention.audit_archive import ArchiveRefused, archive_expired, verify_archive_file
from tools_app.retention.models import AuditRetention, RetentionOverride
from tools_app.retention.policy import (
    APP_KINDS,
    CHANGE_RETENTION,
    KINDS,
    delete_override,
    kept_for,
    kinds,
    save_override,
    set_audit_retention,
)
from tools_app.retention.purge import PURGER, PurgeReport, purge, purge_kind, register_retained, shred

__all__ = ["APP_KINDS", "CHANGE_RETENTION", "KINDS", "PURGER", "ArchiveRefused", "AuditRetention",
           "PurgeReport", "RetentionOverride", "archive_expired", "delete_override", "kept_for", "kinds",
           "purge", "purge_kind", "register_retained", "save_override", "set_audit_retention", "shred",
           "verify_archive_file"]
