"""A long task's key stays bound to its task for the task's whole life (issue 27, item 1).

start_task's record finishes the moment its task is created; the key must still answer that task,
never start a second one, for as long as the task is unfinished, whatever the record's age, and
after it ends for the long tool's retention counted from the end. In-process against real
PostgreSQL; time passes as the database sees it (`hours_pass` moves every stored time the
retention and the waits are counted from back by that much, so the database's clock is that much
further on for them; a running task's lease is left as its live worker keeps renewing it).
"""

from datetime import timedelta

import pytest
from django.db.models import F

from tests.support.tasks_support import TEXT, agent, start
from tools_app import engine, retention, tasks
from tools_app.core.errors import Transient
from tools_app.core.leases import new_owner
from tools_app.engine.models import IdempotencyRecord
from tools_app.models import Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.tasks import state
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

ARGUMENTS = {"text": TEXT}


def hours_pass(hours: float) -> None:
    """The database's clock moves on `hours` for every record and task."""
    delta = timedelta(hours=hours)
    IdempotencyRecord.objects.update(created_at=F("created_at") - delta, updated_at=F("updated_at") - delta,
                                     finished_at=F("finished_at") - delta, expires_at=F("expires_at") - delta)
    Task.objects.update(created_at=F("created_at") - delta, updated_at=F("updated_at") - delta,
                        finished_at=F("finished_at") - delta, next_retry_at=F("next_retry_at") - delta)


def start_again(caller, key="k-1"):
    return call_tool(get_tool("start_task"), caller,
                     {"tool": "ingest_document", "arguments": ARGUMENTS, "idempotency_key": key})


def fetched(task) -> Task:
    return Task.objects.get(pk=task.pk)


def paused_by_its_agent(task, caller):
    tasks.pause(task, agent(caller), reason="the customer wants to check the file")


def running(task, caller):
    assert state.take(str(task.pk), new_owner()) is not None


def retrying(task, caller):
    owner = new_owner()
    taken = state.take(str(task.pk), owner)
    assert state.retry_later(taken, owner, Transient("the index is busy"), 3600, waited_by_worker=False)


def waiting_for_input(task, caller):
    owner = new_owner()
    taken = state.take(str(task.pk), owner)
    assert state.pause_for_input(taken, owner, "Which language is the document in?",
                                 {"language": {"message": "Which language?", "schema": {"type": "string"}}})


@pytest.mark.parametrize("put_in_state, status", [
    (paused_by_its_agent, TaskStatus.PAUSED), (running, TaskStatus.RUNNING), (retrying, TaskStatus.RETRYING),
    (waiting_for_input, TaskStatus.PAUSED)], ids=["paused", "running", "retrying", "input-required"])
def test_the_key_of_an_unfinished_task_answers_that_task_long_after_the_records_retention(
        transactional_db, caller, fast, put_in_state, status):
    # given a task, unfinished, whose start_task record's retention (24 h) ended a day ago
    task = start(caller, ARGUMENTS)
    put_in_state(fetched(task), caller)
    hours_pass(48)

    # when the agent calls start_task again with the same key and arguments
    again = start_again(caller)

    # then it is answered that same task, and no second task exists
    assert again.error is None, again.error
    assert (again.result["task_id"], again.replayed) == (str(task.pk), True)
    assert Task.objects.count() == 1
    assert fetched(task).status == status
    # and the answer says the key has no end of retention while its task is unfinished
    assert engine.retention_ends_at(again.record) is None


def test_a_task_that_finished_23_hours_after_it_started_keeps_its_key_for_the_full_retention_from_its_end(
        transactional_db, caller, fast):
    # given a task that ran for 23 hours (paused, then resumed) and then succeeded
    task = start(caller, ARGUMENTS)
    paused_by_its_agent(fetched(task), caller)
    hours_pass(23)
    tasks.resume(fetched(task), agent(caller))
    task_jobs.run_task(str(task.pk))
    assert fetched(task).status == TaskStatus.SUCCEEDED

    # when 23 hours after its end (46 after its start) the same start_task comes again
    hours_pass(23)
    again = start_again(caller)

    # then it is that task, finished
    assert again.error is None, again.error
    assert (again.result["task_id"], again.replayed) == (str(task.pk), True)
    assert Task.objects.count() == 1
    assert engine.retention_ends_at(again.record) is not None

    # and only once ingest_document's retention (24 h) from its end has passed is the key used anew,
    # as start_task's expiry policy says (a new operation)
    hours_pass(2)
    later = start_again(caller)
    assert later.error is None, later.error
    assert later.result["task_id"] != str(task.pk) and not later.replayed
    assert Task.objects.count() == 2


def test_the_key_of_a_fork_answers_the_fork_while_it_is_unfinished(transactional_db, caller, fast):
    # given a fork of a cancelled task, queued, whose fork_task record's retention ended long ago
    original = start(caller, ARGUMENTS)
    tasks.cancel(fetched(original), agent(caller), reason="wrong file")
    fork_arguments = {"task_id": str(original.pk), "from_step": "receive", "idempotency_key": "f-1"}
    forked = call_tool(get_tool("fork_task"), caller, fork_arguments)
    assert forked.error is None, forked.error
    hours_pass(30)

    # when the agent asks for the fork again with the same key
    again = call_tool(get_tool("fork_task"), caller, fork_arguments)

    # then it is the same fork, not a second one
    assert again.error is None, again.error
    assert (again.result["task_id"], again.replayed) == (forked.result["task_id"], True)
    assert Task.objects.filter(forked_from=original).count() == 1


def test_the_purge_and_an_operator_leave_the_key_of_an_unfinished_task_bound_to_it(transactional_db, caller, fast):
    # given a task paused for longer than records are kept (30 days)
    task = start(caller, ARGUMENTS)
    paused_by_its_agent(fetched(task), caller)
    hours_pass(24 * 40)
    record = IdempotencyRecord.objects.get(tool="start_task")

    # when the purge runs and an operator tries to force the key's retention to end or to release it
    retention.purge()
    forced = engine.end_retention(record, actor="olga", reason="tidy up")
    released = engine.release(record, actor="olga", reason="tidy up", checked="nothing")

    # then the record keeps the task's handle, the key is still live, and start_task answers that task
    record.refresh_from_db()
    assert (forced, released, record.retired_at, record.purged_at) == (False, False, None, None)
    assert record.result["task_id"] == str(task.pk)
    again = start_again(caller)
    assert (again.result["task_id"], again.replayed) == (str(task.pk), True)


def test_a_failed_task_resumed_binds_its_key_again_until_it_ends_again(transactional_db, caller, fast):
    # given a task that failed transiently (its key's retention then counted from the failure) and was resumed
    task = start(caller, ARGUMENTS)
    owner = new_owner()
    assert state.fail(state.take(str(task.pk), owner), owner, Transient("the index was down"))
    tasks.resume(fetched(task), agent(caller))
    paused_by_its_agent(fetched(task), caller)

    # when two days pass with it paused, and start_task comes again
    hours_pass(48)
    again = start_again(caller)

    # then the key answers the resumed task
    assert (again.result["task_id"], again.replayed) == (str(task.pk), True)
    assert Task.objects.count() == 1


def test_a_long_tool_called_directly_answers_its_paused_task_after_the_records_retention(transactional_db, caller,
                                                                                        fast):
    # given ingest_document called directly, its task paused, and two days gone by
    first = call_tool(get_tool("ingest_document"), caller, {**ARGUMENTS, "idempotency_key": "d-1"})
    assert first.error.error_class == "in_progress"
    task = Task.objects.get()
    paused_by_its_agent(task, caller)
    hours_pass(48)

    # when the agent calls it again with the same key
    again = call_tool(get_tool("ingest_document"), caller, {**ARGUMENTS, "idempotency_key": "d-1"})

    # then it is told about that same task, still paused, and no second task exists
    assert again.error.error_class == "in_progress"
    assert again.error.details == {"task_id": str(task.pk), "task_status": TaskStatus.PAUSED}
    assert Task.objects.count() == 1
