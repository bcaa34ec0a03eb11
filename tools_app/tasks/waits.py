"""Durable waits: a step waits for an event (a downstream's callback, an approval, a message with a
correlation key) or until a time, and the task waits parked in the database, holding no worker.

Modelled on Inngest's `waitForEvent` and DBOS's `recv`/`send`:
- `StepContext.wait_for_event(event, key, timeout=...)` answers the event's payload if it was sent
  (before or after the wait began: events are kept by tenant, event and correlation key), or None
  once the wait's timeout passed; otherwise the step stops (`Parked`) and the task is parked
  (`state.park`: paused, no lease, `waiting_until` its wait's end), its status saying what it
  waits for, since when, and when it gives up.
- `StepContext.sleep_until(when)`: the same, with no event.
- `send_event` stores the event (once: a second send of the same tenant, event and key counts for
  nothing, by the unique constraint) and wakes the tasks parked on it (`state.wake`): the step runs
  again from its start, reaches the same wait (`TaskWait`, by its place in the step, keeps the time
  it began and gives up at), and this time gets the payload.
- The sweep (`wake_due`, every IDEMOPS_LEASE_SWEEP_SECONDS in the cluster's loop) wakes the tasks
  whose wait's time came, and any whose event is there (a safety net: `send_event` and `park` take
  the same advisory lock, so neither misses the other).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef

from tools_app.access.models import Tenant
from tools_app.core import clock
from tools_app.core.errors import InvalidInput
from tools_app.tasks import state
from tools_app.tasks.models import StepRun, Task, TaskEvent, TaskStatus, TaskWait
from tools_app.toolkit.pipelines import Parked

logger = logging.getLogger(__name__)

RECEIVED = "received"
TIMED_OUT = "timed_out"
WAKER = "system:task-waits"
MAX_EVENT_LENGTH = 100
MAX_KEY_LENGTH = 200


class WaitStore:
    """What StepContext's waits call: the waits of one run of one step (numbered in the order it reaches them)."""

    def __init__(self, task: Task, sequence: int) -> None:
        self.task = task
        self.sequence = sequence
        self.reached = 0

    def _place(self, event: str, key: str, until: datetime | timedelta, description: str) -> tuple[TaskWait, datetime]:
        number, self.reached = self.reached, self.reached + 1
        now = clock.read()
        ends = now + until if isinstance(until, timedelta) else until
        wait, _ = TaskWait.objects.get_or_create(
            task=self.task, sequence=self.sequence, number=number,
            defaults={"event": event, "key": key, "description": description[:200], "since": now, "until": ends})
        if (wait.event, wait.key) != (event, key):
            raise InvalidInput(f"wait {number} of this step waited for {wait.event or 'a time'} {wait.key!r}; "
                               f"now it asks for {event or 'a time'} {key!r}: a step's waits must come in the same "
                               "order every time it runs")
        return wait, now

    def wait_for_event(self, event: str, key: str, *, timeout: timedelta, description: str = "") -> Any:
        _check_names(event, key)
        if timeout <= timedelta(0):
            raise ValueError(f"a wait's timeout must be positive, got {timeout}")
        wait, now = self._place(event, key, timeout, description)
        found = TaskEvent.objects.filter(tenant_id=self.task.tenant_id, event=event, key=key).first()
        if found is not None:
            _end(wait, RECEIVED)
            return found.payload
        if now >= wait.until:
            _end(wait, TIMED_OUT)
            return None
        raise Parked(wait)

    def sleep_until(self, when: datetime | timedelta, description: str = "") -> None:
        wait, now = self._place("", "", when, description)
        if now >= wait.until:
            _end(wait, TIMED_OUT)
            return
        raise Parked(wait)


def _check_names(event: str, key: str) -> None:
    if not event or len(event) > MAX_EVENT_LENGTH:
        raise InvalidInput(f"an event's name is 1 to {MAX_EVENT_LENGTH} characters")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"an event's correlation key is 1 to {MAX_KEY_LENGTH} characters")


def _end(wait: TaskWait, outcome: str) -> None:
    TaskWait.objects.filter(pk=wait.pk, ended_at__isnull=True).update(ended_at=clock.NOW, outcome=outcome)


def _stamp(moment: datetime) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%SZ}"


def describe(wait: TaskWait) -> str:
    """The task's status while parked: what it waits for, since when, and when it gives up."""
    if not wait.event:
        what = f" ({wait.description})" if wait.description else ""
        return f"waiting until {_stamp(wait.until)}{what}, since {_stamp(wait.since)}"
    what = wait.description or f"event {wait.event!r}"
    return (f"waiting for {what} (event {wait.event!r}, key {wait.key!r}) since {_stamp(wait.since)}, "
            f"gives up at {_stamp(wait.until)}")


def _lock(tenant_id: int, event: str, key: str) -> None:
    """The lock `send_event` and `park` share for one tenant, event and key (until the transaction ends)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 42))", [f"{tenant_id}\x1f{event}\x1f{key}"])


@transaction.atomic
def park(task: Task, owner: str, wait: TaskWait, run: StepRun | None) -> bool:
    """The runner caught Parked: park the task (state.park). If the event arrived meanwhile (after the step
    looked), wake it at once: under the lock send_event takes, one of the two sees the other."""
    if wait.event:
        _lock(task.tenant_id, wait.event, wait.key)
    if not state.park(task, owner, describe(wait), wait.until, run):
        return False
    if wait.event and TaskEvent.objects.filter(tenant_id=task.tenant_id, event=wait.event, key=wait.key).exists():
        state.wake(task, WAKER, f"event {wait.event!r} {wait.key!r} arrived")
    return True


@transaction.atomic
def send_event(tenant: int | Tenant, event: str, key: str, payload: Any = None, *, sender: str = "") -> bool:
    """Deliver `event` with correlation `key` (and its JSON `payload`) to the tenant's tasks waiting for it,
    now or later. True: it was new (and the waiting tasks are woken); False: it was sent before, and this
    one counts for nothing (its payload is not kept)."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    _check_names(event, key)
    _lock(tenant_id, event, key)
    try:
        with transaction.atomic():
            TaskEvent.objects.create(tenant_id=tenant_id, event=event, key=key, payload=payload,
                                     sender=sender[:200], received_at=clock.read())
    except IntegrityError:
        return False
    waiting = Task.objects.filter(
        tenant_id=tenant_id, status=TaskStatus.PAUSED, waiting_until__isnull=False,
        waits__event=event, waits__key=key, waits__ended_at__isnull=True).distinct().order_by("pk")
    for task in waiting:
        state.wake(task, sender or WAKER, f"event {event!r} {key!r} arrived")
    return True


def wake_due() -> int:
    """The sweep's part: wake the parked tasks whose wait's time came, or whose event is there."""
    arrived = TaskEvent.objects.filter(tenant_id=OuterRef("task__tenant_id"), event=OuterRef("event"),
                                       key=OuterRef("key"))
    with_event = TaskWait.objects.filter(task=OuterRef("pk"), ended_at__isnull=True).exclude(event="").filter(
        Exists(arrived))
    due = (Task.objects.filter(status=TaskStatus.PAUSED, waiting_until__lte=clock.NOW)
           | Task.objects.filter(status=TaskStatus.PAUSED, waiting_until__isnull=False).filter(Exists(with_event)))
    woken = 0
    for task in due.defer("arguments", "sealed_arguments", "result").order_by("pk"):
        woken += state.wake(task, state.TASK_SWEEPER, "its wait ended")
    return woken
