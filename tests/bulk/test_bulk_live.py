"""A bulk action end to end across real processes: an operator, logged in over real HTTP with a second
factor (uvicorn), counts and confirms "resolve as not done"; a real django-q2 cluster runs it in batches of
IDEMOPS_BULK_BATCH_SIZE=50; the progress page, read over HTTP, shows it advance to done. And a Stop posted
over HTTP while a batch runs: that batch finishes, no further batch starts, the rest stay UNKNOWN.

To read the page mid-way without racing the cluster, the test holds row locks (a connection of its own,
SELECT ... FOR UPDATE) on the records of the later items: the worker's batch waits there (seen in
pg_stat_activity), the page is read, the locks are released. Every count is a count of rows."""

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx2
import psycopg
import pytest
from django.db import connection
from django.urls import reverse
from django_q.models import OrmQ

from tests.bulk.support import unknown_records
from tests.support.operators import admin_session, login_for_the_web_server, make_operator
from tests.support.processes import WebServer, Worker, running
from tests.support.processes import test_database_url as database_url  # not collected as a test
from tests.support.task_stack import wait_until
from tools_app import bulk
from tools_app.access.roles import OPERATOR
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

BATCH = 50
ENV = {"IDEMOPS_BULK_BATCH_SIZE": str(BATCH), "IDEMOPS_Q_WORKERS": "2"}
NEW = reverse("admin:tools_app_bulkaction_new")


@pytest.fixture(scope="module")
def processes(django_db_setup, django_db_blocker):
    """A web process and a job cluster, each its own process, on the test database."""
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            started = stack.enter_context(running(lambda: WebServer("bulk-web", **ENV),
                                                  lambda: Worker("bulk-jobs", **ENV)))
        yield started


@pytest.fixture
def operator(processes, transactional_db, tenant) -> httpx2.Client:
    """alice, an operator of acme, logged in to the web process with her password and authenticator code."""
    login_for_the_web_server(make_operator("alice", OPERATOR, tenant))
    return admin_session(processes[0], "alice")


def still_unknown() -> int:
    return IdempotencyRecord.objects.filter(status=RecordStatus.UNKNOWN).count()


def csrf(http: httpx2.Client) -> str:
    return http.cookies["csrftoken"]


def confirmed(http: httpx2.Client, total: int) -> tuple[bulk.BulkAction, str]:
    """Open the new-bulk-action page, post the filter to see the count, confirm "resolve as not done";
    the action and its progress page's path."""
    page = http.get(NEW)
    assert page.status_code == 200 and 'id="bulk-form"' in page.text, page.text[:500]
    counted = http.post(NEW, data={"target": "unknown", "count": "1", "csrfmiddlewaretoken": csrf(http)})
    assert f"<strong>{total}</strong> matches" in counted.text and 'id="confirm-bulk"' in counted.text
    assert bulk.BulkAction.objects.count() == 0  # counting started nothing
    answer = http.post(NEW, data={"target": "unknown", "confirm": "1", "action": "resolve_not_done",
                                  "reason": "the gateway's log shows none of them arrived",
                                  "csrfmiddlewaretoken": csrf(http)})
    assert answer.status_code == 302, answer.text[:500]
    action = bulk.BulkAction.objects.get(pk=int(re.search(r"/(\d+)/progress/$", answer.headers["location"])[1]))
    assert action.total == total
    return action, answer.headers["location"]


def shown(http: httpx2.Client, path: str) -> tuple[str, int, int]:
    """(state, handled, total) as the progress page shows them."""
    page = http.get(path)
    assert page.status_code == 200, page.text[:500]
    counts = re.search(r'id="bulk-counts">(\d+) of (\d+) handled', page.text)
    return re.search(r'id="bulk-state">([^<]+)<', page.text)[1], int(counts[1]), int(counts[2])


@contextmanager
def records_held(record_ids: list[int]) -> Iterator[None]:
    """Row locks on these records, from a connection of the test's own, until the block ends."""
    with psycopg.connect(database_url()) as held:
        held.execute(f"SELECT id FROM {IdempotencyRecord._meta.db_table} WHERE id = ANY(%s) FOR UPDATE",
                     [record_ids])
        yield
        held.rollback()


def a_worker_waits_on_a_held_record() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database()")
        return cursor.fetchone()[0] > 0


def items_before_the_first_held(action: bulk.BulkAction, held: set[int]) -> int:
    """How many of the action's items (in the order the worker takes them) come before the first held record."""
    order = list(bulk.BulkItem.objects.filter(bulk=action).order_by("id").values_list("object_id", flat=True))
    return next(i for i, object_id in enumerate(order) if int(object_id) in held)


def test_an_operator_resolves_hundreds_over_http_and_the_cluster_shows_progress_batch_by_batch(operator, tenant):
    # given: 300 UNKNOWN records, and the records from the 151st on held by another transaction
    ids = sorted(record.pk for record in unknown_records(tenant, 300))
    held = set(ids[150:])
    with records_held(sorted(held)):
        # when: alice counts and confirms over HTTP, and the cluster runs batches until one waits on a held row
        action, progress_page = confirmed(operator, 300)
        wait_until(a_worker_waits_on_a_held_record, timeout=120, what="a batch to reach a held record")
        midway = shown(operator, progress_page)
        resolved_midway = 300 - still_unknown()
        before = items_before_the_first_held(action, held)

    # then: mid-way the page showed the batches finished so far: a partial count, as the rows say
    assert before > 0, "the frozen selection put a held record first: no batch could finish before it"
    assert midway == ("Running", before // BATCH * BATCH, 300), midway
    assert 0 < midway[1] < 300 and resolved_midway == before  # the waiting batch had handled the rows before it

    # and: once released, the page is polled until it says done, its count only growing
    seen = [midway[1]]

    def done() -> bool:
        state, handled, _ = shown(operator, progress_page)
        seen.append(handled)
        return state == "Done"

    wait_until(done, timeout=120, what="the bulk action to finish")
    assert seen == sorted(seen) and seen[-1] == 300
    assert still_unknown() == 0
    resolved = IdempotencyRecord.objects.filter(status=RecordStatus.FAILED)
    assert resolved.count() == 300 and all(
        record.evidence[-1]["reason"] == "the gateway's log shows none of them arrived" for record in resolved)
    assert AuditEvent.objects.filter(action="record.reconciled", actor="user:alice").count() == 300
    action.refresh_from_db()
    assert (action.state, action.done, action.failed) == ("done", 300, 0)


def test_stop_over_http_ends_the_action_after_the_batch_under_way_and_handles_nothing_past_it(operator, tenant):
    # given: 300 UNKNOWN records; the records from the 101st on held, so a batch waits mid-way
    ids = sorted(record.pk for record in unknown_records(tenant, 300))
    held = set(ids[100:])
    with records_held(sorted(held)):
        action, progress_page = confirmed(operator, 300)
        wait_until(a_worker_waits_on_a_held_record, timeout=120, what="a batch to reach a held record")
        before = items_before_the_first_held(action, held)

        # when: alice presses Stop while that batch waits
        stop_page = operator.get(progress_page)
        assert 'id="bulk-stop"' in stop_page.text
        stopped = operator.post(reverse("admin:tools_app_bulkaction_stop", args=[action.pk]),
                                data={"csrfmiddlewaretoken": csrf(operator)})
        assert stopped.status_code == 302
        assert shown(operator, progress_page)[0] == "Stopping (after the current batch)"

    # then: the batch under way finishes and the action ends stopped; no further batch started
    wait_until(lambda: shown(operator, progress_page)[0] == "Stopped", timeout=120, what="the action to stop")
    wait_until(lambda: not OrmQ.objects.exists(), timeout=60, what="the cluster's queue to empty")
    action.refresh_from_db()
    through_its_batch = (before // BATCH + 1) * BATCH
    assert before > 0, "the frozen selection put a held record first"
    assert (action.state, action.done, action.failed) == ("stopped", through_its_batch, 0)
    assert action.done < action.total == 300
    assert 300 - still_unknown() == through_its_batch  # counted rows: nothing past the stop was handled
    assert bulk.BulkItem.objects.filter(bulk=action, outcome=bulk.BulkItem.PENDING).count() == 300 - through_its_batch
    assert AuditEvent.objects.filter(action="bulk.stop_requested", actor="user:alice").count() == 1
    assert AuditEvent.objects.filter(action="bulk.stopped").count() == 1
    assert shown(operator, progress_page)[1:] == (through_its_batch, 300)
