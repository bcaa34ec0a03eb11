"""Following a call by its trace id, and reading the platform's figures, against real processes:
uvicorn and a django-q2 cluster (their own JSON log files), the payment gateway and the
notification sink, the SDK's MCP client over HTTP.
"""

from __future__ import annotations

import asyncio
import re

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.issued_ids import call_labelled_sync, labelled_arguments
from tests.support.mcp_client import call, call_sync, post_raw, raw_call
from tests.support.observability_support import (
    METRICS_TOKEN,
    events,
    in_trace,
    lines,
    new_trace,
    trace_of,
    traceparent,
)
from tests.support.processes import WebServer
from tests.support.task_stack import wait_until
from tools_app.models import (
    AuditEvent,
    IdempotencyRecord,
    OutboxEvent,
    RecordStatus,
    StepRun,
    Task,
    TaskStatus,
)

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "B-1", "quantity": 1, "unit_price": "2.50"}]}
EVERY_NAME = [
    "idemops_tool_calls", "idemops_tool_call_seconds", "idemops_processing_timeouts", "idemops_unknown_records",
    "idemops_downstream_duplicates", "idemops_reconciliations", "idemops_tasks", "idemops_task_step_seconds",
    "idemops_task_lease_expiries", "idemops_outbox_events", "idemops_outbox_delivery_lag_seconds",
    "idemops_approvals_waiting", "idemops_approvals_oldest_waiting_seconds",
]


def call_in_trace(url: str, token: str, trace: tuple[str, str], tool: str, arguments: dict):
    async def traced():
        with in_trace(*trace):
            return await call(url, token, tool, arguments)

    return asyncio.run(traced())


def scrape(base_url: str, **headers: str) -> dict[str, list]:
    """name -> samples of GET /metrics."""
    response = httpx2.get(f"{base_url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {family.name: family.samples for family in text_string_to_metric_families(response.text)}


def value(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


# --- traces -------------------------------------------------------------------------------------------


def test_a_call_with_a_known_traceparent_is_followed_through_record_task_gateway_outbox_and_logs(
        observed, token, settle_tasks):
    trace = new_trace()
    trace_id = trace[0]
    url = observed.web.mcp_url

    # a payment whose answer is lost: UNKNOWN, then reconciled by the cluster by asking the gateway
    observed.gateway.set_fault("*", "succeed-then-hang", times=1)
    payment_arguments = labelled_arguments(url, token, "request_payment", {
        "amount": "12.00", "currency": "EUR", "payee": "Traced Payee", "idempotency_key": "pay-traced"})
    paid = call_in_trace(url, token, trace, "request_payment", payment_arguments)
    assert paid.structured_content["error"]["class"] == "unknown_outcome"
    # a long task, run by the cluster step by step
    started = call_in_trace(url, token, trace, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "# Traced\n\nA short document."},
        "idempotency_key": "doc-traced"})
    # a webhook and an email, delivered by the relay
    hook = call_in_trace(url, token, trace, "send_notification", {
        "channel": "webhook", "recipient": f"{observed.sink.url}/webhooks/traced", "subject": "Hi", "body": "B",
        "idempotency_key": "hook-traced"})
    mail = call_in_trace(url, token, trace, "send_notification", {
        "channel": "email", "recipient": "ops@example.test", "subject": "Hi", "body": "B",
        "idempotency_key": "mail-traced"})

    # the records, the task and its steps, the outbox events and their audit events carry the trace id
    payment = wait_until(lambda: IdempotencyRecord.objects.filter(key=payment_arguments["idempotency_key"],
                                                                 status=RecordStatus.SUCCEEDED)
                         .first(), what="the payment to be reconciled")
    task = wait_until(lambda: Task.objects.filter(pk=started.structured_content["task_id"],
                                                  status=TaskStatus.SUCCEEDED).first(), what="the task")
    hook_event = OutboxEvent.objects.get(pk=hook.structured_content["notification_id"])
    mail_event = OutboxEvent.objects.get(pk=mail.structured_content["notification_id"])
    wait_until(lambda: OutboxEvent.objects.filter(pk__in=[hook_event.pk, mail_event.pk], status="delivered").count()
               == 2, what="both deliveries")
    assert payment.trace_id == task.trace_id == task.record.trace_id == trace_id
    assert hook_event.trace_id == mail_event.trace_id == trace_id
    assert {run.trace_id for run in StepRun.objects.filter(task=task)} == {trace_id}
    assert StepRun.objects.filter(task=task).count() == task.steps_total
    assert set(AuditEvent.objects.filter(object_id=str(payment.pk), object_type="idempotencyrecord")
               .values_list("trace_id", flat=True)) == {trace_id}
    assert set(AuditEvent.objects.filter(object_id=str(hook_event.pk)).values_list("trace_id", flat=True)) == {
        trace_id}

    # the gateway saw the trace on the payment and on the reconciler's question
    seen = observed.gateway.traceparents()
    assert ("POST", "/payments") in [(m, p) for m, p, t in seen if trace_of(t) == trace_id]
    assert ("GET", "/payments") in [(m, p) for m, p, t in seen if trace_of(t) == trace_id]
    # the sink got it on the webhook (HTTP header) and the email (mail header)
    delivered = observed.sink.traceparents()
    assert trace_of(delivered[str(hook_event.pk)]) == trace_of(delivered[str(mail_event.pk)]) == trace_id

    # and the logs of both processes: one line per call, per step, per delivery, per reconciliation
    logs = observed.logs()
    web, jobs = logs["web-observed"], logs["jobs-observed"]
    calls = events(web, "tool.call", trace_id=trace_id)
    assert sorted(line["tool"] for line in calls) == [
        "request_payment", "send_notification", "send_notification", "start_task"]
    assert all({"span_id", "tenant_id", "outcome", "duration_ms"} <= line.keys() for line in calls)
    steps = events(jobs, "task.step", trace_id=trace_id, task_id=str(task.pk))
    assert [line["step"] for line in steps] == [step.step for step in StepRun.objects.filter(task=task)]
    assert {line["outcome"] for line in steps} == {"succeeded"}
    assert {line["outbox_event"] for line in events(jobs, "outbox.delivery", trace_id=trace_id,
                                                     outcome="delivered")} == {str(hook_event.pk), str(mail_event.pk)}
    reconciled = events(jobs, "reconciliation", trace_id=trace_id, result="succeeded")
    assert [line["operation_id"] for line in reconciled] == [str(payment.operation_id)]


def test_a_traceparent_in_params_meta_or_in_the_http_header_becomes_the_records_trace(observed, token):
    in_meta, in_header = new_trace(), new_trace()
    url = observed.web.mcp_url

    # params._meta.traceparent (MCP SEP-414), as a raw JSON-RPC message
    answer = post_raw(url, token, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "create_order", "arguments": {**ORDER, "idempotency_key": "o-meta"},
        "_meta": {"traceparent": traceparent(*in_meta)}}})
    assert answer.status_code == 200
    # only the HTTP header
    header = httpx2.post(url, timeout=30, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "create_order", "arguments": {**ORDER, "idempotency_key": "o-header"}}}, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18", "traceparent": traceparent(*in_header)})
    assert header.status_code == 200
    # neither: a trace of its own
    raw_call(url, token, "create_order", {**ORDER, "idempotency_key": "o-none-1"})
    raw_call(url, token, "create_order", {**ORDER, "idempotency_key": "o-none-2"})

    traces = dict(IdempotencyRecord.objects.values_list("key", "trace_id"))
    assert traces["o-meta"] == in_meta[0] and traces["o-header"] == in_header[0]
    assert len({traces["o-none-1"], traces["o-none-2"], in_meta[0], in_header[0]}) == 4
    assert all(len(traces[key]) == 32 and int(traces[key], 16) for key in ("o-none-1", "o-none-2"))


# --- metrics ------------------------------------------------------------------------------------------


def test_metrics_show_every_name_after_a_short_demo_counted_by_every_process_and_kept_across_restarts(
        observed, token, settle_tasks, _gateway, _sink):
    url = observed.web.mcp_url
    for key in ("m-1", "m-1", "m-2"):  # executed, replayed, executed
        call_sync(url, token, "create_order", {**ORDER, "idempotency_key": key})
    call_sync(url, token, "create_order", {**ORDER, "customer": "Other", "idempotency_key": "m-1"})  # conflict
    call_labelled_sync(url, token, "request_payment", {"amount": "3.00", "currency": "EUR", "payee": "P",
                                                       "idempotency_key": "m-pay"})
    started = call_sync(url, token, "start_task", {"tool": "ingest_document", "arguments": {"text": "metrics"},
                                                   "idempotency_key": "m-doc"})
    call_sync(url, token, "send_notification", {"channel": "email", "recipient": "m@example.test", "subject": "S",
                                                "body": "B", "idempotency_key": "m-mail"})
    call_labelled_sync(url, token, "publish_announcement", {"title": "T", "body": "B", "audience": "staff",
                                                            "idempotency_key": "m-ann"})
    wait_until(lambda: Task.objects.filter(pk=started.structured_content["task_id"], status="succeeded").exists(),
               what="the task")
    wait_until(lambda: OutboxEvent.objects.filter(status="delivered").exists(), what="the delivery")

    # what the cluster counted (steps, deliveries) and this test's calls are in the web process's answer, once
    # flushed (each process writes its counts about once a second; earlier tests' counts may already be there)
    lag = "idemops_outbox_delivery_lag_seconds"
    metrics = wait_until(lambda: (m := scrape(observed.web.base_url)) and value(m[lag], f"{lag}_count")
                         and value(m["idemops_task_step_seconds"], "idemops_task_step_seconds_count",
                                   tool="ingest_document", step="summarize")
                         and value(m["idemops_tool_calls"], "idemops_tool_calls_total", tool="create_order",
                                   outcome="conflict") and m,
                         what="the cluster's counts and this test's calls")
    assert [name for name in EVERY_NAME if not metrics.get(name)] == []
    calls = metrics["idemops_tool_calls"]
    counted = {outcome: value(calls, "idemops_tool_calls_total", tool="create_order", outcome=outcome)
               for outcome in ("executed", "replayed", "conflict")}
    assert counted["executed"] >= 2 and counted["replayed"] >= 1 and counted["conflict"] >= 1
    assert value(metrics["idemops_tool_call_seconds"], "idemops_tool_call_seconds_count", tool="create_order",
                 outcome="replayed") >= 1
    assert value(metrics["idemops_approvals_waiting"], "idemops_approvals_waiting", tool="publish_announcement") >= 1
    assert value(metrics["idemops_outbox_events"], "idemops_outbox_events", status="delivered") >= 1

    # another web process, started after all this, answers the same figures
    second = WebServer("web-observed-2", **observed.env)
    try:
        again = scrape(second.base_url)
    finally:
        second.stop()
    assert value(again["idemops_tool_calls"], "idemops_tool_calls_total", tool="create_order",
                 outcome="replayed") >= counted["replayed"]


def test_on_call_sees_each_live_job_cluster_and_its_processes_and_a_killed_one_goes_within_seconds(
        transactional_db, observed):
    from tests.deploy.test_serve import children
    from tests.support.processes import Worker
    from tools_app.metrics.processes import version

    def clusters() -> float:
        return value(scrape(observed.web.base_url)["idemops_job_clusters"], "idemops_job_clusters")

    before = wait_until(clusters, what="the observed cluster's heartbeat")
    cluster = Worker("jobs-on-call", IDEMOPS_Q_WORKERS="2")
    try:
        # a cluster started: one more alive, and each of its processes' figures, by role and pid
        wait_until(lambda: clusters() == before + 1, timeout=30, what="the new cluster's heartbeat")
        metrics = scrape(observed.web.base_url)
        memory = {(s.labels["process"], int(s.labels["pid"])) for s in metrics["process_resident_memory_bytes"]
                  if s.value > 0}
        [sentinel] = children(cluster.process.pid)
        assert {("jobs", cluster.process.pid), ("jobs-sentinel", sentinel)} <= memory
        assert {pid for role, pid in memory if role == "jobs-worker"} >= set(sorted(children(sentinel))[:2])
        assert ("web", observed.web.process.pid) in memory
        assert {s.labels["version"] for s in metrics["idemops_build_info"]} == {version()}

        # and SIGKILLed, it is no longer counted once its heartbeat expires (3 s)
        cluster.kill()
        wait_until(lambda: clusters() == before, timeout=30, what="the killed cluster to be gone")
    finally:
        cluster.stop(grace=3)


def test_metrics_answer_a_scraper_with_the_token_and_refuse_a_wrong_one(observed):
    with_token = httpx2.get(f"{observed.web.base_url}/metrics", timeout=30,
                            headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    wrong = httpx2.get(f"{observed.web.base_url}/metrics", timeout=30, headers={"Authorization": "Bearer nope"})

    assert with_token.status_code == 200 and "idemops_tool_calls_total" in with_token.text
    assert wrong.status_code == 401 and wrong.json()["error"]["class"] == "permission_denied"


def test_every_log_line_of_the_web_process_is_one_json_object_with_its_level_and_time(observed, token):
    call_sync(observed.web.mcp_url, token, "whoami", {})
    text = observed.logs()["web-observed"]
    parsed = lines(text)

    assert parsed and all({"event", "level", "timestamp", "logger"} <= line.keys() for line in parsed)
    assert events(text, "tool.call", tool="whoami", outcome="executed")
    assert [line for line in parsed if line["event"] == "http.request" and line["url_path"] == "/mcp"]


# --- redaction ----------------------------------------------------------------------------------------

# Recognisable values, each in one argument a tool declares personal (or a secret): none may reach a log.
PERSONAL = {
    "customer": "Quillon Zephyrine-Customer",
    "ticket_subject": "Quillon's knee subject",
    "ticket_body": "Quillon Zephyrine lives at 12 Vexhall Lane",
    "payee": "Vexhall Trading Payee",
    "payment_reference": "Reference QZ-558812",
    "email": "quillon.zephyrine@example.test",
    "mail_subject": "Vexhall subject line",
    "mail_body": "Vexhall body of the mail",
    "hook_name": "quillon-hook-path",
    "hook_token": "HOOKSIGNEDTOKEN4417",
    "reason": "Quillon asked to be forgotten",
    "title": "Vexhall farewell party",
    "announcement": "Quillon leaves on Friday",
    "document": "Quillon Zephyrine's medical history, page one",
    "document_title": "Quillon's file title",
    "document_token": "DOCSIGNEDTOKEN7731",
    "query": "Zephyrine medical",
    "cancel_reason": "cancelled because Quillon said so",
    "fork_reason": "re-run because Quillon's summary was off",
    "pause_reason": "paused until Quillon signs",
    "resume_input": "Quillon's answer to the paused step",
    "close_note": "closed once Quillon moved to Vexhall",
    "customer_name": "Zephyrine Onboarded-Quillon",
    "customer_email": "zephyrine.onboarded@example.test",
    "iban": "GB82WEST12345698765432",
}
PASSWORD = "Pa55word-Quillon-999"


def test_no_token_key_password_or_personal_value_sent_through_any_tool_reaches_a_log(
        observed, token, doc_server, settle_tasks):
    from tests.support.api_support import key_client
    from tests.support.operators import make_operator
    from tools_app import approvals
    from tools_app.access.roles import APPROVER
    from tools_app.models import ApprovalRequest, Tenant
    from tools_app.toolkit.registry import all_tools

    url, sink = observed.web.mcp_url, observed.sink
    raw_keys = [f"RAWKEY-ZQX-{n:02d}" for n in range(18)]
    doc_url = doc_server.serve(f"quillon.txt?token={PERSONAL['document_token']}", PERSONAL["document"].encode())
    called: dict[str, object] = {}

    def use(tool: str, arguments: dict):
        called[tool] = result = call_sync(url, token, tool, arguments)
        return result

    def high_risk(tool: str, arguments: dict, raw_key: str):
        """A high-risk call: its operation id prepared first (under a raw key, with its personal arguments)."""
        prepared = use("prepare_operation", {"tool": tool, "arguments": arguments, "idempotency_key": raw_key})
        return use(tool, {**arguments, "idempotency_key": prepared.structured_content["operation_id"]})

    order = use("create_order", {**ORDER, "customer": PERSONAL["customer"], "idempotency_key": raw_keys[0]})
    use("get_order", {"order_id": order.structured_content["order_id"]})
    ticket = use("create_ticket", {"subject": PERSONAL["ticket_subject"], "body": PERSONAL["ticket_body"],
                                   "idempotency_key": raw_keys[1]})
    use("get_ticket", {"ticket_id": ticket.structured_content["ticket_id"]})
    paid = high_risk("request_payment", {"amount": "9.99", "currency": "EUR", "payee": PERSONAL["payee"],
                                         "reference": PERSONAL["payment_reference"]}, raw_keys[2])
    use("get_operation", {"operation_id": paid.structured_content["idempotency"]["operation_id"]})
    use("get_operation", {"tool": "create_order", "idempotency_key": raw_keys[0]})
    mail = use("send_notification", {"channel": "email", "recipient": PERSONAL["email"],
                                      "subject": PERSONAL["mail_subject"], "body": PERSONAL["mail_body"],
                                      "idempotency_key": raw_keys[3]})
    call_sync(url, token, "send_notification", {
        "channel": "webhook", "recipient": f"{sink.url}/webhooks/{PERSONAL['hook_name']}?t={PERSONAL['hook_token']}",
        "subject": PERSONAL["mail_subject"], "body": PERSONAL["mail_body"], "idempotency_key": raw_keys[4]})
    use("get_notification", {"notification_id": mail.structured_content["notification_id"]})
    high_risk("delete_record", {"kind": "order", "id": order.structured_content["order_id"],
                                "reason": PERSONAL["reason"]}, raw_keys[5])
    high_risk("publish_announcement", {"title": PERSONAL["title"], "body": PERSONAL["announcement"],
                                       "audience": "staff"}, raw_keys[6])
    use("list_announcements", {})
    ingested = use("ingest_document", {"url": doc_url, "title": PERSONAL["document_title"],
                                       "idempotency_key": raw_keys[7]})
    task_id = ingested.structured_content["error"]["task_id"]
    started = use("start_task", {"tool": "ingest_document", "arguments": {"text": PERSONAL["document"]},
                                 "idempotency_key": raw_keys[8]})
    use("get_task_status", {"task_id": task_id, "wait_seconds": 30})
    wait_until(lambda: Task.objects.filter(pk=started.structured_content["task_id"], status="succeeded").exists(),
               what="the inline document's task")
    use("get_task_result", {"task_id": task_id, "wait_seconds": 30})
    use("search_documents", {"query": PERSONAL["query"]})
    document_id = called["get_task_result"].structured_content["result"]["document_id"]
    use("get_document", {"document_id": document_id, "include_text": True})
    use("resume_task", {"task_id": task_id, "input": {"answer": PERSONAL["resume_input"]},
                        "idempotency_key": raw_keys[9]})
    use("cancel_task", {"task_id": started.structured_content["task_id"], "reason": PERSONAL["cancel_reason"],
                        "idempotency_key": raw_keys[10]})
    fork = use("fork_task", {"task_id": started.structured_content["task_id"], "from_step": "summarize",
                             "reason": PERSONAL["fork_reason"], "idempotency_key": raw_keys[11]})
    use("pause_task", {"task_id": fork.structured_content["task_id"], "reason": PERSONAL["pause_reason"],
                       "idempotency_key": raw_keys[12]})
    use("process_ticket_batch", {"ticket_ids": [ticket.structured_content["ticket_id"]],
                                  "change": {"type": "close", "note": PERSONAL["close_note"]},
                                  "idempotency_key": raw_keys[13]})
    use("onboard_customer", {"name": PERSONAL["customer_name"], "email": PERSONAL["customer_email"],
                             "iban": PERSONAL["iban"], "idempotency_key": raw_keys[14]})
    use("whoami", {})
    scheduled = use("schedule_operation", {"tool": "create_order",
                                           "arguments": {**ORDER, "customer": PERSONAL["customer"]},
                                           "run_at": "2099-01-01T00:00:00+00:00", "idempotency_key": raw_keys[15]})
    schedule_id = scheduled.structured_content["schedule_id"]
    use("get_schedule", {"schedule_id": schedule_id})
    use("pause_schedule", {"schedule_id": schedule_id, "reason": PERSONAL["pause_reason"],
                           "idempotency_key": raw_keys[16]})
    use("resume_schedule", {"schedule_id": schedule_id, "reason": PERSONAL["cancel_reason"],
                            "idempotency_key": raw_keys[17]})
    # a person approves the deletion and the announcement: the cluster runs them
    tenant = Tenant.objects.get(slug="acme")
    bob = make_operator("bob", APPROVER, tenant)
    for request in ApprovalRequest.objects.filter(status="pending"):
        approvals.approve(request, bob)
    use("get_approval_status", {"request_id": ApprovalRequest.objects.get(tool="publish_announcement").pk})
    wait_until(lambda: ApprovalRequest.objects.filter(status="executed").count() == 2, what="the approved calls")
    # the email, the webhook and the onboarding's welcome email
    def outbox() -> list[tuple[str, str, int, str]]:
        return sorted(OutboxEvent.objects.values_list("kind", "status", "attempts", "last_error"))

    def delivered() -> bool:
        rows = outbox()
        return len(rows) >= 3 and all(status == "delivered" for _, status, _, _ in rows)

    try:  # on a loaded machine a delivery may be retried once (core.backoff): wait longer than one backoff
        wait_until(delivered, timeout=180, what="the deliveries")
    except AssertionError as timed_out:
        tasks = sorted(Task.objects.values_list("tool", "status", "failure_class", "failure_reason"))
        raise AssertionError(f"{timed_out}; the outbox holds {outbox()}; tasks: {tasks}") from None
    assert [kind for kind, *_ in outbox()] == ["notification.email", "notification.email", "notification.webhook"]
    # an auditor exports, a forged token and a wrong admin password are refused
    auditor = key_client(tenant)
    assert httpx2.get(f"{observed.web.base_url}/api/v1/idempotency-records", timeout=30, headers={
        "Authorization": f"Bearer {auditor.raw_key}"}).status_code == 200
    forged = "idm_" + "Forged" * 6
    assert post_raw(url, forged, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401
    with httpx2.Client(base_url=observed.web.base_url, timeout=30) as browser:
        form = browser.get("/admin/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
        login = browser.post("/admin/login/", data={"username": "bob", "password": PASSWORD,
                                                    "csrfmiddlewaretoken": csrf})
    assert login.status_code == 200 and "Please enter the correct username and password" in login.text

    # every tool was called, and each call, step and delivery left its line
    assert set(called) == {spec.name for spec in all_tools()}
    logs = observed.logs()
    web, jobs = logs["web-observed"], logs["jobs-observed"]
    assert {line["tool"] for line in events(web, "tool.call")} >= set(called)
    assert events(jobs, "task.step", outcome="succeeded") and events(jobs, "outbox.delivery", outcome="delivered")
    # and no log line of either process shows any of it
    secrets = [*PERSONAL.values(), *raw_keys, token, forged, auditor.raw_key, PASSWORD]
    leaked = {(name, secret) for name, text in logs.items() for secret in secrets if secret in text}
    assert leaked == set()
