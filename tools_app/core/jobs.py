"""Every django-q2 job idemops queues or schedules, by name: the one place their dotted paths are written.

Code queues a job by its name (`enqueue("outbox.relay")`), so no package
imports another (or its own jobs module) just to queue work, and the paths
django-q2 stores in queued jobs and schedules are spelled once. Each path
names a function in a package's `jobs.py` (the audit chain's in this module);
a test checks that every one resolves. Jobs queued before the packages moved
hold older paths: `tools_app/__init__.py` keeps those resolving.

With the ORM broker, `enqueue` writes the job in the caller's transaction: if
the change that queued it rolls back, so does the job.
"""

from __future__ import annotations

from typing import Any

from django_q.tasks import async_task

from tools_app.core import audit

JOBS: dict[str, str] = {
    "approvals.run_approved": "tools_app.approvals.jobs.run_approved",
    "approvals.sweep": "tools_app.approvals.jobs.sweep",
    "audit.seal": "tools_app.core.jobs.seal_audit_chain",
    "outbox.relay": "tools_app.outbox.jobs.relay_pending",
    "reconciliation.reconcile_due": "tools_app.reconciliation.jobs.reconcile_due",
    "reconciliation.run_periodic": "tools_app.reconciliation.jobs.run_periodic",
    "retention.purge": "tools_app.retention.jobs.purge_expired",
    "tasks.run_task": "tools_app.tasks.jobs.run_task",
    "tasks.sweep": "tools_app.tasks.jobs.sweep",
}


def enqueue(name: str, *args: Any, **options: Any) -> str:
    """Queue the job `name` (a key of JOBS) with `args`; `options` are django-q2's (task_name, group, save)."""
    return async_task(JOBS[name], *args, **options)


def seal_audit_chain() -> int:
    """django-q2 job: link newly committed audit events into the hash chain (audit.seal)."""
    return audit.seal(wait=False).sealed


# The name an older release queued the audit chain's job under (tools_app.audit.seal_periodically).
seal_periodically = seal_audit_chain
