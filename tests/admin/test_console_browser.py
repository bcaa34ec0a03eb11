"""The operators' console in a real browser: each queue's main path, from the home page to the item settled.

Agents act over MCP against the live server; the browser (tests/support/browser.py) is the operator. What
the browser shows is checked on the page, what it did in the database. Screenshots of the main
pages are the ones docs/operators-admin.md shows (`make screenshots`).
"""

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.utils import timezone

from tests.support.api_support import make_record
from tests.support.browser import browser_page, code_for, log_in, needs_chromium, shot
from tests.support.issued_ids import call_labelled_sync
from tests.support.jobs import run_queued_jobs
from tests.support.mcp_client import call_sync, error_of
from tests.support.operators import login_for_the_web_server, make_operator
from tools_app import outbox
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.conf import override_conf
from tools_app.core import polling
from tools_app.metrics import trends
from tools_app.models import (
    ApprovalRequest,
    ApprovalStatus,
    IdempotencyRecord,
    MetricMinute,
    OutboxEvent,
    OutboxStatus,
    RecordStatus,
    Task,
    TaskStatus,
    Tenant,
)

pytestmark = needs_chromium


def person(username, role, email=""):
    user = make_operator(username, role, Tenant.objects.get(slug="acme"))
    user.email = email
    user.save(update_fields=["email"])
    login_for_the_web_server(user)
    return user


def announce(web_server, token, key="ann-1", title="Maintenance window"):
    args = {"title": title, "body": "Down at 2am", "audience": "staff", "idempotency_key": key}
    # In a thread of its own: the MCP client runs an event loop, and so does Playwright while a page is open.
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(call_labelled_sync, web_server.mcp_url, token, "publish_announcement", args).result()
    return error_of(answer)["approval"], args


def test_a_new_operator_starts_at_the_console_and_finds_every_queue_with_its_count(web_server, token):
    # given: one pending approval; an operator and an approver of acme
    announce(web_server, token)
    person("olga", OPERATOR)
    person("bob", APPROVER)

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga")
        page.wait_for_selector(".console-queues")
        shot(page, "console-home", doc=True)
        cards = page.locator(".queue-card")
        names = [cards.nth(i).locator(".queue-name").inner_text() for i in range(cards.count())]
        counts = {page.locator(".queue-card .queue-name").nth(i).inner_text():
                  page.locator(".queue-card .queue-count").nth(i).inner_text() for i in range(cards.count())}
        title = page.title()
        nav = page.locator("#nav-sidebar").count()

        page.context.clear_cookies()
        log_in(page, web_server.base_url, "bob")
        page.wait_for_selector(".console-queues")
        bob_names = page.locator(".queue-card .queue-name").all_inner_texts()

    # then: the work first, in the console's order, with counts; each role sees its own queues
    assert names == ["Pending approvals", "UNKNOWN outcomes", "Failed or stuck tasks", "Dead-lettered events"]
    assert counts["Pending approvals"] == "1" and counts["UNKNOWN outcomes"] == "0"
    assert "idemops" in title and nav == 0
    assert bob_names == ["Pending approvals"]


def test_an_approver_follows_the_email_link_logs_in_and_approves(web_server, token, downstreams, sink):
    # given: an approver with an address; the agent asks; the relay delivers the approvers' email to the sink
    person("alice", APPROVER, email="alice@example.invalid")
    approval, args = announce(web_server, token)
    assert outbox.relay_batch().delivered == 1
    [(body,)] = sink.sql("SELECT body FROM messages WHERE channel = 'email' AND recipient = %s",
                         ["alice@example.invalid"])
    link = re.search(r"http://127\.0\.0\.1:\d+/admin/approval/decide/[^/\s]+/", body).group(0)  # her own link

    with browser_page() as page:
        # when: she opens the link, logs in where it sends her, and approves with one click
        page.goto(link)
        page.fill("#id_username", "alice")
        page.fill("#id_password", "correct-horse-battery")
        page.fill("#id_otp_token", code_for("alice"))  # and her authenticator's code
        page.click("input[type=submit]")
        page.wait_for_selector("#decide-approve")
        landed = page.url
        shot(page, "approval-request", doc=True)
        page.fill("#id_reason", "checked with the team")
        shot(page, "approval-confirm", doc=True)
        page.click("#decide-approve")
        page.wait_for_selector("#approval-done")
        message = page.locator("#approval-done").inner_text()

    # then: the link led to the decision, and the decision is hers
    assert landed == link
    assert "Approved: it is being executed." in message
    request = ApprovalRequest.objects.get(pk=approval["request_id"])
    assert (request.status, request.decided_by) == (ApprovalStatus.APPROVED, "user:alice")
    run_queued_jobs()
    assert not call_labelled_sync(web_server.mcp_url, token, "publish_announcement", args).is_error


def test_an_operator_reconciles_an_unknown_payment_from_the_queue(web_server, token, gateway):
    # given: a payment the gateway made whose answer never arrived
    gateway.set_fault("*", "succeed-then-hang", times=1)
    answer = call_labelled_sync(web_server.mcp_url, token, "request_payment",
                                {"amount": "99.00", "currency": "EUR", "payee": "Bob", "idempotency_key": "pay-1"})
    assert error_of(answer)["class"] == "unknown_outcome"
    record = IdempotencyRecord.objects.get(status=RecordStatus.UNKNOWN)
    person("olga", OPERATOR)

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga")
        page.click("#queue-2")  # the home page's UNKNOWN outcomes card
        page.wait_for_selector("#result_list")
        shot(page, "unknown-queue", doc=True)
        page.locator("#result_list tbody tr").first.locator("th a").click()
        page.wait_for_selector("#action-reconcile")
        shot(page, "unknown-record", doc=True)
        page.click("#action-reconcile")
        page.click("#confirm-action")
        page.wait_for_selector("ul.messagelist")
        message = page.locator("ul.messagelist").inner_text()
        left = page.locator("#result_list tbody tr").count() if page.locator("#result_list").count() else 0

    assert "now succeeded" in message and left == 0
    record.refresh_from_db()
    assert record.status == RecordStatus.SUCCEEDED and len(gateway.payments()) == 1


def test_an_operator_resumes_a_failed_task_from_the_queue(web_server, token):
    tenant = Tenant.objects.get(slug="acme")
    now = timezone.now()
    task = Task.objects.create(tenant=tenant, record=make_record(tenant, tool="ingest_document"),
                               tool="ingest_document", arguments={}, input_digest="d" * 64,
                               status=TaskStatus.FAILED, failure_class="transient", failure_reason="fetch timed out",
                               steps_total=6, max_attempts=5, created_at=now - timedelta(minutes=9),
                               updated_at=now - timedelta(minutes=9))
    person("olga", OPERATOR)

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga", "/admin/tools_app/taskneedingattention/")
        page.wait_for_selector("#result_list")
        flagged = page.locator("#result_list tbody tr .stands-out").count()
        shot(page, "task-queue", doc=True)
        page.locator("#result_list tbody tr").first.locator("th a").click()
        page.click("#action-resume")
        page.click("#confirm-action")
        page.wait_for_selector("ul.messagelist")
        message = page.locator("ul.messagelist").inner_text()

    assert flagged == 1 and "now created" in message
    task.refresh_from_db()
    assert task.status == TaskStatus.CREATED


def test_an_operator_redrives_dead_letters_in_bulk_with_the_keyboard_and_one_confirmation(
        web_server, token, downstreams, sink, settings):
    # given: two notifications the sink refused until the relay gave up on them
    override_conf(settings, outbox_max_attempts=1)
    sink.set_faults(fail_times=2)
    for key in ("n-1", "n-2"):
        answer = call_sync(web_server.mcp_url, token, "send_notification", {
            "channel": "webhook", "recipient": f"{sink.url}/webhooks/ops", "subject": f"Disk full {key}",
            "body": "90%", "idempotency_key": key})
        assert not answer.is_error
    assert outbox.relay_batch().dead == 2
    person("olga", OPERATOR)

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga")
        page.wait_for_selector(".console-queues")
        page.keyboard.press("g")
        page.keyboard.press("l")  # go to the dead letters
        page.wait_for_selector("#result_list")
        for _ in range(2):
            page.keyboard.press("j")
            page.keyboard.press("x")
        page.select_option("select[name=action]", "redrive")
        shot(page, "dead-letters-selected", doc=True)
        page.click("button[name=index]")
        page.wait_for_selector("#operator-action-form")
        confirm_items = page.locator("#operator-action-form li").count()
        page.fill("#id_reason", "sink is back")
        page.click("#confirm-action")
        page.wait_for_selector("ul.messagelist")
        messages = page.locator("ul.messagelist li").all_inner_texts()

    assert confirm_items == 2 and sum("sent back to the relay" in m for m in messages) == 2
    assert outbox.relay_batch().delivered == 2
    assert not OutboxEvent.objects.filter(status=OutboxStatus.DEAD).exists()
    assert sorted(sink.messages().values()) == [1, 1]  # each delivered once


def test_an_operator_pastes_a_key_into_the_find_box_and_reads_the_operations_story(web_server, token):
    key = "order-2026-0042:jane.roe"
    order = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}],
             "idempotency_key": key}
    first = call_sync(web_server.mcp_url, token, "create_order", order)
    call_sync(web_server.mcp_url, token, "create_order", order)  # a retry: replayed
    record = IdempotencyRecord.objects.get()
    person("olga", OPERATOR)

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga")
        page.wait_for_selector(".console-queues")
        page.keyboard.press("/")
        page.keyboard.type(key)
        shot(page, "find-by-key", doc=True)
        page.keyboard.press("Enter")
        page.wait_for_selector(".story")
        shot(page, "record-story", doc=True)
        url, html = page.url, page.content()
        story = page.locator(".story tbody").inner_text()
        created = page.get_by_role("link", name=f"Order #{first.structured_content['order_id']}").count()

    assert url.endswith(f"/admin/tools_app/idempotencyrecord/{record.pk}/change/")
    assert "jane.roe" not in url and "jane.roe" not in html  # only the digest is shown
    assert "record.claimed" in story and "record.succeeded" in story and created == 1


def test_a_queue_page_refreshes_itself_keeps_its_filters_and_waits_while_rows_are_selected(
        web_server, token, other_token, _gateway, _sink):
    from tests.support.processes import WebServer, downstream_env

    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    login_for_the_web_server(make_operator("bea", APPROVER, acme, globex))
    announce(web_server, token, "a-1", "First")
    fast = WebServer("web-refresh", IDEMOPS_CONSOLE_REFRESH_SECONDS="1", **downstream_env(_gateway, _sink))
    rows = "#result_list tbody tr"
    try:
        with browser_page() as page:
            filtered = f"/admin/tools_app/approvalqueue/?tenant__id__exact={acme.pk}"
            log_in(page, fast.base_url, "bea", filtered.replace("&", "%26").replace("?", "%3F"))
            page.wait_for_selector("#result_list")
            assert page.locator(rows).count() == 1

            # another request for acme, one for globex: the page shows acme's, by itself
            announce(web_server, token, "a-2", "Second")
            announce(web_server, other_token, "g-1", "Elsewhere")
            page.wait_for_function(f"document.querySelectorAll('{rows}').length === 2", timeout=20_000)
            kept_filter = page.url.endswith(filtered)
            shown = page.locator("#result_list tbody").inner_text()

            # a row selected: the page does not reload under the operator, it says the queue changed
            page.locator(f"{rows} input.action-select").first.check()
            announce(web_server, token, "a-3", "Third")
            page.wait_for_selector("#queue-poll .queue-changed", timeout=20_000)
            shot(page, "queue-changed-notice", doc=True)
            still_selected = page.locator(f"{rows} input.action-select").first.is_checked()
            rows_while_busy = page.locator(rows).count()

            # selection cleared: it reloads
            page.locator(f"{rows} input.action-select").first.uncheck()
            page.wait_for_function(f"document.querySelectorAll('{rows}').length === 3", timeout=20_000)
    finally:
        fast.stop()

    assert kept_filter and "Second" in shown and "Elsewhere" not in shown
    assert still_selected and rows_while_busy == 2


def test_the_dashboard_charts_the_seed_metrics_per_tenant_and_tool(web_server, token):
    order = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]}
    for i in range(4):
        call_sync(web_server.mcp_url, token, "create_order", {**order, "idempotency_key": f"o-{i}"})
        call_sync(web_server.mcp_url, token, "create_order", {**order, "idempotency_key": f"o-{i}"})  # replayed
    call_sync(web_server.mcp_url, token, "create_order", {**order, "currency": "USD", "idempotency_key": "o-0"})
    # Each web process writes its counts about once a second.
    rows = MetricMinute.objects.filter(metric="tool_call", tool="create_order")
    assert polling.until(lambda: sum(rows.values_list("count", flat=True)) >= 9, seconds=60, pause=0.2)
    olga = person("olga", OPERATOR)
    acme = Tenant.objects.get(slug="acme")
    trend = trends.trend(olga, "hour", tenant_id=acme.pk, tool="create_order")
    latest = [p.hit_rate_percent for p in trend.points if p.hit_rate_percent is not None]

    with browser_page() as page:
        log_in(page, web_server.base_url, "olga", "/admin/tools_app/dashboard/")
        page.wait_for_selector("#dash-filters")
        page.select_option("#dash-tenant", str(acme.pk))
        page.select_option("#dash-tool", "create_order")
        page.click("#dash-filters button[type=submit]")
        page.wait_for_selector("#trend-hit-rate circle", timeout=20_000)  # the counters are flushed each second
        shot(page, "dashboard-trends", doc=True)
        url = page.url
        hit_rate_tip = page.locator("#trend-hit-rate circle title").last.text_content()

    assert f"tenant={acme.pk}" in url and "tool=create_order" in url
    assert f"hit rate: {latest[-1]:.1f}%" in hit_rate_tip
