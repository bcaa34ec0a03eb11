"""The purge: what is past its retention is removed, a batch per transaction, each object's audit
event in the batch's transaction.

A batch is taken with SELECT ... FOR UPDATE SKIP LOCKED: two purges (two
workers running the schedule) never take the same rows, and a row another
transaction holds (a replay reading a record, a worker finishing a task) is
left for the next round instead of waited for. What stays:

- records: the row (status, fingerprint, digests, times): `arguments` becomes
  {} and `result` null, each piece of `evidence` keeps only when and by whom
  it was gathered, and the raw `key` is replaced by its keyed hash
  (core.keys.purged_key): a call with the key still finds the record and
  follows the tool's expiry policy (`reexecute` frees the key, `hold` answers
  `expired`), since only keys already past their retention are purged. The
  record's approval request loses its `arguments` and its `summary` the values
  of the tool's personal arguments; its outbox events (approvers' messages,
  notifications) lose their payload, and one still pending is dead-lettered;
- tasks: the row and its step history; `arguments`, `sealed_arguments`,
  `result`, `input_request` and `resume_input` are emptied, and so are the
  words a tool's steps may have quoted its arguments in (`failure_reason`,
  `pause_reason`, `progress_message`, each step run's `error`) and the
  caller's `notify_url` (declared personal by start_task);
- artifacts: checkpoints, step batches and artifacts are deleted (resuming a
  task afterwards starts from its first step);
- an app's own kinds (register_retained; the demo's documents, with their chunks
  and vectors): what the app's purge function removes;
- audit events: never purged (the chain stays whole and verifiable); each purged
  object gets one (`record.purged`, `task.purged`, `task.artifacts_purged`, an
  app kind's own action) naming the retention that applied.

Before the rows, the keys (crypto-shredding, `shred`): each data key of the key store whose period ended
(core.keystore) is destroyed, once no row still holds a value under it (a record, task, approval request,
outbox event... not purged yet: core.personal.personal_columns), with an audit event (`data_key.destroyed`,
about the tenant). What the
key encrypted is then unreadable everywhere: in this database, and in every dump, replica, backup and WAL
archive taken of it before (core.personal: it reads `[forgotten]`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Count, Q
from django.db.models.expressions import RawSQL

from tools_app.access.models import Tenant
from tools_app.approvals import purge as approvals_purge
from tools_app.conf import conf
from tools_app.core import audit, clock, keys, keystore, personal
from tools_app.core.models import AuditEvent
from tools_app.engine import FINISHED
from tools_app.engine.models import IdempotencyRecord
from tools_app.outbox import purge as outbox_purge
from tools_app.retention import audit_archive
from tools_app.retention.policy import APP_KINDS, KINDS, AppKind, default_for, kept_for, kinds, load_overrides
from tools_app.tasks.models import Checkpoint, StepBatch, StepRun, Task, TaskArtifact, TaskEvent, TaskStatus
from tools_app.toolkit.registry import all_tools

PURGER = "system:retention-purge"
TASK_FINISHED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED)


# Purges rows (of one model) at a time; returns what each row's audit event says, by primary key.
Purger = Callable[[list[Any], datetime], Mapping[Any, Mapping[str, Any]]]


@dataclass(frozen=True)
class Kind:
    model: type[models.Model]
    tool: str  # lookup of the tool's name
    since: str  # the field the period counts from
    pending: Q  # rows not purged yet that may be
    purge: Purger  # purge these rows; what each audit event says
    action: str


# Each piece of evidence keeps when it was gathered and by whom; what was asked and answered
# (downstream bodies: payees, addresses) goes.
EVIDENCE_OUTLINE = RawSQL("COALESCE((SELECT jsonb_agg(jsonb_build_object('at', e->'at', 'source', e->'source')) "
                          "FROM jsonb_array_elements(evidence) AS e), '[]'::jsonb)", ())
RECORD_FIELDS = ["arguments", "result", "evidence", "key", "approval_request", "outbox_events"]


def _purge_records(rows: list[IdempotencyRecord], now: datetime) -> dict[Any, dict[str, Any]]:
    ids = [r.pk for r in rows]
    IdempotencyRecord.objects.filter(pk__in=ids).update(
        arguments={}, result=None, evidence=EVIDENCE_OUTLINE, key=keys.purged_key_sql(), purged_at=now)
    # Every copy of the call's words goes with it: its approval request's and its messages'.
    approvals_purge.forget_arguments(ids)
    outbox_purge.forget_payloads(ids)
    return {r.pk: {"purged": RECORD_FIELDS} for r in rows}


TASK_FIELDS = ["arguments", "sealed_arguments", "result", "input_request", "resume_input", "failure_reason",
               "pause_reason", "progress_message", "notify_url", "step_runs.error"]


def _purge_tasks(rows: list[Task], now: datetime) -> dict[Any, dict[str, Any]]:
    ids = [t.pk for t in rows]
    # A step's messages are the tool's words, which may quote its arguments (a path, a name): they go too;
    # the failure's class, the steps' outcomes and times stay.
    Task.objects.filter(pk__in=ids).update(
        arguments={}, sealed_arguments="", result=None, input_request=None, resume_input=None, failure_reason="",
        pause_reason="", progress_message="", notify_url="", purged_at=now)
    StepRun.objects.filter(task_id__in=ids).exclude(error="").update(error="")
    return {t.pk: {"purged": TASK_FIELDS} for t in rows}


def _purge_artifacts(rows: list[Task], now: datetime) -> dict[Any, dict[str, Any]]:
    ids = [t.pk for t in rows]
    counted = {name: dict(model.objects.filter(task_id__in=ids).values_list("task_id").annotate(n=Count("pk")))
               for name, model in (("checkpoints", Checkpoint), ("step_batches", StepBatch),
                                   ("artifacts", TaskArtifact))}
    # Checkpoints first: they hold their artifacts (PROTECT).
    for model in (Checkpoint, StepBatch, TaskArtifact):
        model.objects.filter(task_id__in=ids).delete()
    Task.objects.filter(pk__in=ids).update(artifacts_purged_at=now)
    return {t.pk: {name: counts.get(t.pk, 0) for name, counts in counted.items()} for t in rows}


KIND_SPECS: dict[str, Kind] = {
    "records": Kind(IdempotencyRecord, "tool", "finished_at",
                    Q(purged_at__isnull=True, status__in=FINISHED, finished_at__isnull=False), _purge_records,
                    "record.purged"),
    "tasks": Kind(Task, "tool", "finished_at", Q(purged_at__isnull=True, status__in=TASK_FINISHED,
                                                 finished_at__isnull=False), _purge_tasks, "task.purged"),
    "artifacts": Kind(Task, "tool", "finished_at", Q(artifacts_purged_at__isnull=True, status__in=TASK_FINISHED,
                                                     finished_at__isnull=False), _purge_artifacts,
                      "task.artifacts_purged"),
}


def register_retained(kind: str, *, model: type[models.Model], tool: str, since: str,
                      purge: Purger, action: str, default: Callable[[], timedelta], description: str,
                      pending: Q | None = None) -> None:
    """An app's own retention kind (the demo's `documents`): `model`'s rows are removed once past it.
    `tool` is the lookup of the tool that made each row, `since` the field the period counts from,
    `purge(rows, now)` removes them and says what each row's audit event `action` records; `default()`
    is the period when neither a tenant's override nor the tool's `KeepFor(kinds=...)` says one (read it
    from the app's own settings), `description` says what the kind keeps (the console shows it).
    Called from the app's `ready()`."""
    if kind in KINDS:
        raise ValueError(f"retention kind {kind!r} is the platform's own ({', '.join(KINDS)})")
    if kind in KIND_SPECS:
        raise ValueError(f"retention kind {kind!r} already purges {KIND_SPECS[kind].model.__name__}")
    KIND_SPECS[kind] = Kind(model, tool, since, pending if pending is not None else Q(), purge, action)
    APP_KINDS[kind] = AppKind(default, description)


def due(kind: str, now: datetime) -> Q:
    """The rows of `kind` past their retention: a term per tool at its default, and for each tenant with
    overrides a term per tool at what applies to it (policy.kept_for)."""
    spec = KIND_SPECS[kind]
    overrides = load_overrides(kind)
    tools = {tool.name: tool for tool in all_tools()}
    overridden = sorted({tenant_id for tenant_id, _ in overrides})
    # Rows of tools this code no longer declares ("" below) keep the setting's period.
    undeclared = ~Q(**{f"{spec.tool}__in": list(tools)})

    def term(name: str, period: timedelta) -> Q:
        return (Q(**{spec.tool: name}) if name else undeclared) & Q(**{f"{spec.since}__lte": now - period})

    terms = Q(pk__in=[])
    for name in [*tools, ""]:
        terms |= term(name, default_for(kind, tools.get(name))) & ~Q(tenant_id__in=overridden)
        for tenant_id in overridden:
            terms |= Q(tenant_id=tenant_id) & term(name, kept_for(kind, tenant_id, name, overrides))
    return terms


def _extra(kind: str, now: datetime) -> Q:
    # A record is purged only once its key expired: until then a retry must replay its result. A key
    # bound to an unfinished task (`ongoing`) has not, whatever its expires_at says.
    return Q(expires_at__lte=now, ongoing=False) if kind == "records" else Q()


@dataclass
class PurgeReport:
    purged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(kinds(), 0))
    batches: int = 0
    keys_destroyed: int = 0

    @property
    def total(self) -> int:
        return sum(self.purged.values())


def purge_kind(kind: str, *, now: datetime | None = None, batch: int | None = None,
               max_batches: int | None = None) -> tuple[int, int]:
    """Purge `kind` past its retention, a batch per transaction. Returns (rows purged, batches)."""
    spec = KIND_SPECS.get(kind)
    if spec is None:
        return 0, 0  # no installed app keeps objects of this kind
    # The database's time: a host whose clock runs ahead would purge early.
    now = now or clock.read()
    size = batch or conf().retention_purge_batch
    selection = spec.pending & due(kind, now) & _extra(kind, now)
    purged = batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            rows = list(spec.model._default_manager.select_for_update(skip_locked=True, of=("self",)).filter(selection)
                        .order_by(spec.since, "pk")[:size])
            if not rows:
                break
            facts = spec.purge(rows, now)
            AuditEvent.objects.bulk_create(
                audit.new_event(action=spec.action, obj=row, actor=PURGER, trace_id=getattr(row, "trace_id", ""),
                                reason=f"past its {kind} retention", after={"kind": kind, **facts[row.pk]})
                for row in rows)
        purged += len(rows)
        batches += 1
        if len(rows) < size:
            break
    return purged, batches


def keys_in_use() -> set[str]:
    """The ids of the data keys some row still holds a value under: every envelope of every column that stores
    them (core.personal.personal_columns; a purged row holds none, its values emptied), one scan a column."""
    found: set[str] = set()
    with connection.cursor() as cursor:
        for table, column in personal.personal_columns():
            cursor.execute(f'SELECT DISTINCT m[1] FROM "{table}" AS t, '
                           f'regexp_matches(t."{column}"::text, %s, \'g\') AS m WHERE t."{column}"::text LIKE %s',
                           [f'"{personal.VERSION}:([0-9a-f-]{{36}}):', f"%{personal.MARK}%"])
            found.update(row[0] for row in cursor.fetchall())
    return found


def shred(*, now: datetime | None = None) -> int:
    """Destroy the data keys whose period ended and that no kept record needs (each audited); how many."""
    now = now or clock.read()
    destroyed = 0
    expired = keystore.expired(now.date())
    in_use = keys_in_use() if expired else set()
    for key in expired:
        if str(key.id) in in_use:
            continue
        with transaction.atomic():
            # The event commits only if the key is gone: a key destroyed by another purge is not audited twice.
            if keystore.destroy(key.id, by=PURGER):
                AuditEvent.objects.bulk_create([audit.new_event(
                    action="data_key.destroyed", obj=Tenant(pk=key.tenant_id), actor=PURGER,
                    reason="its retention period ended: what it encrypted is forgotten",
                    after={"data_key": str(key.id), "period": key.period.isoformat()})])
                destroyed += 1
    return destroyed


def purge(*, now: datetime | None = None, batch: int | None = None) -> PurgeReport:
    """Every kind, oldest first within each; the apps' kinds before artifacts (an app's object, a document,
    may name a task whose artifacts go next). Then the data keys no kept row needs any more are destroyed
    (`shred`)."""
    report = PurgeReport()
    for kind in (*APP_KINDS, "artifacts", "tasks", "records"):
        count, batches = purge_kind(kind, now=now, batch=batch)
        report.purged[kind] += count
        report.batches += batches
    now = now or clock.read()
    report.purged["confirmations"] = approvals_purge.forget_confirmations(now)
    report.purged["task_events"] = forget_task_events(now)
    # Audit events have their own policy (AuditRetention) and leave as an archived prefix of the chain.
    report.purged["audit_events"] = audit_archive.archive_expired(now=now)
    report.keys_destroyed = shred(now=now)
    return report


def forget_task_events(now: datetime) -> int:
    """Delete the events sent to waiting tasks (send_event, the task-events endpoint) received longer ago
    than tasks are kept (IDEMOPS_RETENTION_TASKS_HOURS): their payloads may hold personal values, and
    a task that waits for one has long had it. Returns how many."""
    deleted, _ = TaskEvent.objects.filter(received_at__lt=now - default_for("tasks", None)).delete()
    return deleted
