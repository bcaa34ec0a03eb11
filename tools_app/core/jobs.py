"""Every django-q2 job idemops queues or schedules, by name: the one place their dotted paths are written.

Code queues a job by its name (`enqueue("outbox.relay")`), so no package
imports another (or its own jobs module) just to queue work, and the paths
django-q2 stores in queued jobs and schedules are spelled once. Each path
names a function in a package's `jobs.py` (the audit chain's in this module);
a test checks that every one resolves. Jobs queued before the packages moved
hold older paths: `tools_app/__init__.py` keeps those resolving.

With the ORM broker, `enqueue` writes the job in the caller's transaction: if
the change that queued it rolls back, so does the job.

A job carries the trace context of whoever queued it in its (signed) payload, and runs in a
span of that trace: `carry_trace`, `open_job_span` and `close_job_span` are django-q2's
pre_enqueue, pre_execute and post_execute_in_worker signals (connected in tools_app/apps.py).
Work on a stored row goes further back: a task's steps, an outbox delivery or a reconciliation
join the trace of the call that wrote the row (core.tracing.continued).
"""

from __future__ import annotations

from collections.abc import Collection
from contextvars import Token
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.status import Stat
from django_q.tasks import async_task
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tools_app.core import audit, audit_partitions, clock, tracing

JOBS: dict[str, str] = {
    "approvals.escalate": "tools_app.approvals.jobs.escalate",
    "approvals.run_approved": "tools_app.approvals.jobs.run_approved",
    "approvals.sweep": "tools_app.approvals.jobs.sweep",
    "audit.partitions": "tools_app.core.jobs.create_audit_partitions",
    "audit.seal": "tools_app.core.jobs.seal_audit_chain",
    "bulk.run": "tools_app.bulk.jobs.run",
    "bulk.sweep": "tools_app.bulk.jobs.sweep_stalled",
    "scheduling.tick": "tools_app.scheduling.jobs.tick",
    "metrics.prune": "tools_app.metrics.jobs.prune_minutes",
    "outbox.relay": "tools_app.outbox.jobs.relay_pending",
    "reconciliation.reconcile_due": "tools_app.reconciliation.jobs.reconcile_due",
    "reconciliation.run_periodic": "tools_app.reconciliation.jobs.run_periodic",
    "retention.purge": "tools_app.retention.jobs.purge_expired",
    "tasks.run_task": "tools_app.tasks.jobs.run_task",
    "tasks.sweep": "tools_app.tasks.jobs.sweep",
}


def enqueue(name: str, *args: Any, **options: Any) -> str:
    """Queue the job `name` (a key of JOBS) with `args`; `options` are django-q2's (task_name, group, save)."""
    task_id: str = async_task(JOBS[name], *args, **options)
    return task_id


def live(names: Collection[str], taken_within: float) -> set[str]:
    """Which of the jobs named `names` (their task_name) the queue still holds for a worker: waiting
    to be taken, or taken by a cluster less than `taken_within` seconds ago.

    The ORM broker keeps a job until it has run: a cluster that takes one locks it for
    django-q2's `retry` (the timeout and more: minutes), and one that dies keeps it locked
    that long; a job that failed (its worker lost the database) is gone. Either way no worker will
    run it soon, which is what a caller that has a lease of its own to go by (a task) needs to know.
    A job's name is in its signed payload, so the jobs held are read to find the caller's few
    names: the sweep asks only when a task has waited past its lease, so a long queue costs that
    read then, not on every round.
    """
    if not names:
        return set()
    # The database's clock, not this host's (which may run an hour ahead of the cluster that took the job,
    # and take every lost job for one waiting its turn). django-q2 writes a job's lock by the clock of the
    # host that queued or took it: a skew there shifts one job's lock, not every judgement of this sweep.
    recently_taken = clock.later(Conf.RETRY - taken_within)  # lock = when taken + retry
    held = OrmQ.objects.using(Conf.ORM).filter(Q(lock__lte=clock.NOW) | Q(lock__gt=recently_taken))
    wanted = set(names)
    return {name for name in (row.name() for row in held.only("payload")) if name in wanted}


@dataclass(frozen=True)
class Queue:
    """The job queue now, as on-call reads it (tools_app.metrics)."""

    waiting: int  # jobs no cluster has taken
    taken: int  # jobs a cluster took and has not finished (or died holding, until django-q2's retry)
    oldest_waiting: datetime | None  # since when the longest-waiting job has waited


def queue() -> Queue:
    jobs = OrmQ.objects.using(Conf.ORM)
    waiting = jobs.filter(lock__lte=clock.NOW).aggregate(n=Count("id"), oldest=Min("lock"))
    # A job's lock is when it was queued until a cluster takes it (then: until when it holds it).
    return Queue(waiting=waiting["n"], taken=jobs.filter(lock__gt=clock.NOW).count(),
                 oldest_waiting=waiting["oldest"])


@dataclass(frozen=True)
class Cluster:
    """A live django-q2 cluster, from its heartbeat: the sentinel writes it to the shared cache (the
    database's, so every machine's clusters are seen) every half second, and it expires after 3."""

    host: str
    pid: int  # the `qcluster` process
    sentinel: int
    workers: tuple[int, ...]
    monitor: int
    pusher: int


def live_clusters() -> list[Cluster]:
    return [Cluster(host=stat.host, pid=stat.pid, sentinel=stat.sentinel, workers=tuple(stat.workers),
                    monitor=stat.monitor, pusher=stat.pusher)
            for stat in Stat.get_all() if stat.status != Conf.STOPPED]


TRACE_KEY = "trace"  # where a job's payload holds its W3C trace context
_NAMES = {path: name for name, path in JOBS.items()}
_open_spans: dict[str, tuple[Span, Token[Context]]] = {}  # job id -> (span, context token), in a worker process


def carry_trace(sender: Any = None, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """pre_enqueue: the current trace context goes into the job's payload."""
    if task is not None and (context := tracing.carrier()):
        task[TRACE_KEY] = context


def open_job_span(sender: Any = None, func: Any = None, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """pre_execute (in the worker): the job runs in a span of the trace it was queued in (a new one if none)."""
    if task is None:
        return
    queued = task.get("func")
    path: str = queued if isinstance(queued, str) else getattr(func, "__qualname__", "job")
    span = tracing.tracer.start_span(f"job {_NAMES.get(path, path)}", context=tracing.context_from(
        task.get(TRACE_KEY)), kind=SpanKind.CONSUMER, attributes={"idemops.job": _NAMES.get(path, path)})
    _open_spans[task["id"]] = (span, tracing.attach(tracing.set_span(span)))


def close_job_span(sender: Any = None, func: Any = None, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """post_execute_in_worker: end the job's span (an error if the job raised)."""
    if task is None or (opened := _open_spans.pop(task["id"], None)) is None:
        return
    span, token = opened
    if task.get("success") is False:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    tracing.detach(token)


def seal_audit_chain() -> int:
    """django-q2 job: link newly committed audit events into the hash chain (audit.seal)."""
    return audit.seal(wait=False).sealed


def create_audit_partitions() -> list[str]:
    """django-q2 job: the audit table's month partitions, created ahead (audit_partitions.ensure)."""
    return audit_partitions.ensure().created


# The name an older release queued the audit chain's job under (tools_app.audit.seal_periodically).
seal_periodically = seal_audit_chain
