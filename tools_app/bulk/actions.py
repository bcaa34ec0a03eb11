"""Bulk actions: confirm one (`start`), run it in batches (`run_batch`, the django-q2 job), stop it
(`stop`), and re-queue one whose job was lost (`sweep`).

Every item goes through the concept's own operator function (reconciliation.reconcile and
resolve_by_operator, tasks.resume, outbox.redrive) as the confirming person: its Permit, its tenant
check, its rules and its audit event apply to each item as they do to one operator's click. The cluster
acts for that person, who entered a second-factor code to confirm (a fresh one when the selection holds
a money tool), so the worker treats them as verified (access.second_factor.at_the_shell).

Crash-safety: the selection is frozen at confirmation (one BulkItem per selected row), so rows that
match later are never swept in. An item's action and its outcome commit in one transaction (reconcile
now asks a downstream system, so no transaction is held across it: it is marked after, and asked again
after a crash, a read). One batch of a bulk action runs at a time (a session advisory lock, released
if its worker dies). Every state change of a BulkAction is `_move`: a guarded UPDATE with its audit event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet

from tools_app import access, outbox, reconciliation, tasks
from tools_app.access import second_factor
from tools_app.bulk.models import BulkAction, BulkItem, BulkState
from tools_app.bulk.selection import SHAPES, Filter, Target, money_tools, selection
from tools_app.conf import conf
from tools_app.core import audit, clock, db, jobs, outage
from tools_app.core.errors import InvalidInput, Refused, ToolFailure

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

logger = logging.getLogger(__name__)

RUN_PERMISSION = "tools_app.run_bulk_action"
RUN = access.Permit(RUN_PERMISSION, "bulk_action", "run bulk actions", "bulk.refused")
STOP = access.Permit(RUN_PERMISSION, "bulk_stop", "run bulk actions", "bulk.refused")
UNFINISHED = [BulkState.RUNNING, BulkState.STOPPING]


@dataclass(frozen=True)
class Action:
    name: str
    label: str
    target: str
    permit: access.Permit  # the per-item permission (checked per item by the concept function, too)
    perform: Callable[[Any, Any, str], str]  # (object, user, reason) -> what became of it
    reason_required: bool = False
    # False: the action asks a downstream system, so no transaction is held across it.
    local: bool = True
    help_text: str = ""


def _reconcile(record: Any, user: Any, reason: str) -> str:
    return f"now {reconciliation.reconcile(record, user)}"


def _resolve_not_done(record: Any, user: Any, reason: str) -> str:
    reconciliation.resolve_by_operator(record, user, succeeded=False, reason=reason)
    return "resolved as not done"


def _resume(task: Any, user: Any, reason: str) -> str:
    return f"now {tasks.resume(task, user).status}"


def _redrive(event: Any, user: Any, reason: str) -> str:
    if not outbox.redrive(event, user, reason=reason):
        raise Refused("it is no longer dead-lettered")
    return "sent back to the relay"


ACTIONS: dict[str, Action] = {action.name: action for action in [
    Action("reconcile", "Reconcile now", Target.UNKNOWN, reconciliation.RECONCILE, _reconcile, local=False,
           help_text="Ask each record's downstream system now, by the key we sent."),
    Action("resolve_not_done", "Resolve as not done", Target.UNKNOWN, reconciliation.RESOLVE, _resolve_not_done,
           reason_required=True,
           help_text="Definitely not done (say what you checked: the evidence kept on every record). The agents "
                     "may then retry with the same key."),
    Action("resume", "Resume", Target.TASKS, tasks.RESUME, _resume,
           help_text="Continue each task from its last valid checkpoint (paused, or failed with a transient class "
                     "or a cause marked fixed; the others are refused, each with its reason)."),
    Action("redrive", "Re-deliver", Target.DEAD_LETTERS, outbox.REDRIVE, _redrive,
           help_text="Send each event to the relay again; receivers deduplicate by event id."),
]}


def actions_for(target: str) -> list[Action]:
    return [action for action in ACTIONS.values() if action.target == target]


# --- confirming --------------------------------------------------------------------------------------


def authorize(user: User | AnonymousUser, action: Action) -> str:
    """The actor name of `user` if they may run `action` in bulk: the bulk permission, the action's own
    permission and a verified second factor (each item's tenant is checked again as it runs). A refusal
    is audited, then raised."""
    access.authorize(user, RUN, BulkAction)
    return access.authorize(user, action.permit, BulkAction)


def start(user: User | AnonymousUser, flt: Filter, action_name: str, *, reason: str = "") -> BulkAction:
    """Confirm `action_name` over what `flt` selects now: the selection is frozen, the BulkAction audited
    and its first batch queued, in one transaction. Refused: no permission or second factor, a money
    tool in the selection without a fresh second factor (step-up), nothing selected."""
    action = ACTIONS.get(action_name)
    if action is None or action.target != flt.target:
        raise InvalidInput(f"{action_name!r} is not an action on {Target(flt.target).label}")
    actor = authorize(user, action)
    assert user.pk is not None, "authorize refuses an anonymous user"
    reason = reason.strip()
    if action.reason_required and not reason:
        raise InvalidInput(f"{action.label} needs a reason: what you checked")
    rows = selection(flt, user)
    money = money_tools(rows, flt.target)
    if money and not second_factor.fresh(user, conf().step_up_minutes):
        refusal = (f"step-up: the selection holds money tools ({', '.join(money)}): confirming needs a "
                   f"second-factor code entered within the last {conf().step_up_minutes:g} minutes")
        access.audit_refusal(RUN, BulkAction, actor, refusal)
        raise second_factor.StaleSecondFactor(refusal)
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            user_id=user.pk, actor=actor, target=flt.target, action=action.name, filter=flt.as_json(),
            reason=reason, stepped_up=bool(money), created_at=clock.NOW, progress_at=clock.NOW)
        total = _freeze(bulk, rows)
        if total == 0:
            transaction.set_rollback(True)
            raise InvalidInput("nothing matches this filter now: no action was started")
        BulkAction.objects.filter(pk=bulk.pk).update(total=total, tenant_ids=_tenants(rows))
        bulk.refresh_from_db()
        audit.record_event(action="bulk.started", obj=bulk, actor=actor, reason=reason,
                           after={"action": action.name, "filter": bulk.filter, "total": total,
                                  "stepped_up": bool(money)})
        jobs.enqueue("bulk.run", bulk.pk, task_name=job_name(bulk))
    return bulk


def _freeze(bulk: BulkAction, rows: Any) -> int:
    """One INSERT ... SELECT of the selected rows' ids as the action's items; how many."""
    sql, params = rows.values_list("pk", flat=True).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {db.table(BulkItem)} (bulk_id, object_id, outcome, message) "
                       f"SELECT %s, selected.id::text, '', '' FROM ({sql}) AS selected(id)", [bulk.pk, *params])
        return int(cursor.rowcount)


def _tenants(rows: Any) -> list[int]:
    """The tenants of the selection's rows (read in the transaction that froze them: a row that arrived
    since can only add a tenant, which narrows who sees the action, never widens it)."""
    return sorted(set(rows.order_by().values_list("tenant_id", flat=True).distinct()))


def visible(actions: QuerySet[BulkAction], user: Any) -> QuerySet[BulkAction]:
    """The bulk actions `user` may see (and stop): those whose selection lies within the user's tenants."""
    tenants = access.visible_tenant_ids(user)
    return actions if tenants is None else actions.filter(tenant_ids__contained_by=sorted(tenants))


def job_name(bulk: BulkAction) -> str:
    return f"bulk-{bulk.pk}"


# --- stopping ----------------------------------------------------------------------------------------


def stop(bulk: BulkAction, user: User | AnonymousUser, *, reason: str = "") -> bool:
    """Ask a running bulk action to stop: the batch under way finishes, no further batch starts."""
    actor = access.authorize(user, STOP, bulk)  # the bulk permission, all its tenants, a second factor
    with transaction.atomic():
        if not _move(bulk, BulkState.RUNNING, BulkState.STOPPING, action="bulk.stop_requested", actor=actor,
                     reason=reason):
            return False
        jobs.enqueue("bulk.run", bulk.pk, task_name=job_name(bulk))  # stopped at once if no batch is running
    return True


def _move(bulk: BulkAction, before: str, after: str, *, action: str, actor: str, reason: str = "",
          **changes: Any) -> bool:
    """The one way a BulkAction changes state: from `before` (guarded) to `after`, with its audit event."""
    final = {"finished_at": clock.NOW} if after in (BulkState.STOPPED, BulkState.DONE) else {}
    return db.transition(bulk, {"state": before}, {"state": after, **final, **changes}, action=action,
                         actor=actor, reason=reason, before={"state": before},
                         after={"state": after, "total": bulk.total, "done": bulk.done, "failed": bulk.failed})


# --- running -----------------------------------------------------------------------------------------

BULK_WORKER = "system:bulk"
LOCK_SPACE = 36_005  # pg_advisory_lock(space, bulk id): one batch of a bulk action at a time


@contextmanager
def _exclusive(bulk_id: int) -> Iterator[bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_SPACE, bulk_id])
        mine = bool(cursor.fetchone()[0])
    try:
        yield mine
    finally:
        if mine:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_SPACE, bulk_id])


def run_batch(bulk_id: int) -> dict[str, int]:
    """The django-q2 job: the next batch (IDEMOPS_BULK_BATCH_SIZE items) of a running bulk action, its
    progress counted, then the next batch queued, or the action ended (done, or stopped if asked)."""
    with _exclusive(bulk_id) as mine:
        if not mine:  # another worker runs a batch of it now (a job the sweep queued again)
            return {"handled": 0}
        bulk = BulkAction.objects.filter(pk=bulk_id).first()
        if bulk is None or bulk.state not in UNFINISHED:
            return {"handled": 0}
        handled = 0
        if bulk.state == BulkState.RUNNING:
            handled = _batch(bulk)
        _progress(bulk)
        return {"handled": handled}


def _batch(bulk: BulkAction) -> int:
    action = ACTIONS[bulk.action]
    model = SHAPES[bulk.target].model
    user = second_factor.at_the_shell(get_user_model().objects.get(pk=bulk.user_id))
    items = list(BulkItem.objects.filter(bulk=bulk, outcome=BulkItem.PENDING).order_by("id")[:conf().bulk_batch_size])
    pk = model._meta.pk
    assert pk is not None
    objects = model._default_manager.in_bulk([pk.to_python(item.object_id) for item in items])
    for item in items:
        _handle(bulk, action, item, objects.get(pk.to_python(item.object_id)), user)
    return len(items)


def _handle(bulk: BulkAction, action: Action, item: BulkItem, obj: Any, user: Any) -> None:
    try:
        with transaction.atomic() if action.local else nullcontext():
            if obj is None:
                raise Refused("it no longer exists")
            message = action.perform(obj, user, bulk.reason)
            _mark(item, BulkItem.DONE, message)
    except (ToolFailure, Refused) as refused:  # not done, and why (the concept audited a refusal)
        _mark(item, BulkItem.FAILED, str(getattr(refused, "message", "") or refused))
    except outage.DATABASE_ERRORS:
        raise  # the job fails; the sweep queues it again and the item is taken again
    except Exception as unexpected:  # one item's bug does not stop the others
        logger.exception("bulk %s: item %s failed", bulk.pk, item.object_id)
        _mark(item, BulkItem.FAILED, f"internal error ({type(unexpected).__name__}); see the logs")


def _mark(item: BulkItem, outcome: str, message: str) -> None:
    BulkItem.objects.filter(pk=item.pk, outcome=BulkItem.PENDING).update(outcome=outcome, message=message[:2000])


def _progress(bulk: BulkAction) -> None:
    """Count the items (crash-proof: from their outcomes), then queue the next batch or end it."""
    counts = BulkItem.objects.filter(bulk=bulk).aggregate(
        done=Count("id", filter=Q(outcome=BulkItem.DONE)), failed=Count("id", filter=Q(outcome=BulkItem.FAILED)),
        pending=Count("id", filter=Q(outcome=BulkItem.PENDING)))
    with transaction.atomic():
        BulkAction.objects.filter(pk=bulk.pk, state__in=UNFINISHED).update(
            done=counts["done"], failed=counts["failed"], progress_at=clock.NOW)
        bulk.refresh_from_db()
        if bulk.state == BulkState.STOPPING:
            _move(bulk, BulkState.STOPPING, BulkState.STOPPED, action="bulk.stopped", actor=BULK_WORKER,
                  reason=f"stopped by an operator; {counts['pending']} items not handled")
        elif counts["pending"] == 0:
            _move(bulk, BulkState.RUNNING, BulkState.DONE, action="bulk.finished", actor=BULK_WORKER)
        elif bulk.state == BulkState.RUNNING:
            jobs.enqueue("bulk.run", bulk.pk, task_name=job_name(bulk))


def sweep() -> int:
    """Queue again the unfinished bulk actions whose job was lost: no progress for IDEMOPS_BULK_STALL_MINUTES
    (a second job of one that is only slow waits for its lock and does nothing)."""
    stalled = BulkAction.objects.filter(state__in=UNFINISHED,
                                        progress_at__lt=clock.later(-60 * conf().bulk_stall_minutes))
    count = 0
    for bulk in stalled:
        jobs.enqueue("bulk.run", bulk.pk, task_name=job_name(bulk))
        count += 1
    return count


def progress(bulk: BulkAction) -> dict[str, Any]:
    """What the console shows: counts, the share handled, and the latest refusals."""
    handled = bulk.done + bulk.failed
    return {"handled": handled, "percent": round(100 * handled / bulk.total) if bulk.total else 100,
            "failures": list(BulkItem.objects.filter(bulk=bulk, outcome=BulkItem.FAILED)
                             .order_by("-id").values_list("object_id", "message")[:20])}
