"""Redaction that holds: keyed key digests, failure text withheld from every export, URL tokens never stored.

Each test goes through the real paths: the engine and the task runner on
real PostgreSQL, the auditors' API (JSON and CSV), the admin pages, and for
payments and documents real HTTP servers.
"""

import hashlib
import hmac
import json
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from idemops_demo.models import Document
from tests.support.api_support import ENDPOINTS, key_client, make_event, make_record
from tests.support.issued_ids import call_labelled
from tests.support.task_stack import DocServer
from tools_app import engine
from tools_app.conf import conf, override_conf
from tools_app.core import keys, redaction
from tools_app.models import AuditEvent, Checkpoint, IdempotencyRecord, RecordStatus, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

RECORDS = "/api/v1/idempotency-records"


def superuser_client() -> Client:
    user = get_user_model().objects.create_superuser("root", password="pw-root-1234")
    client = Client()
    client.force_login(user)
    return client


def everything_exported(client) -> str:
    """Every endpoint's JSON list and CSV export, as one text to search."""
    parts = []
    for endpoint in ENDPOINTS:
        listed = client.get(f"/api/v1/{endpoint}", {"page_size": 1000})
        assert listed.status_code == 200, listed.content
        parts.append(listed.content.decode())
        exported = client.get(f"/api/v1/{endpoint}/export.csv")
        assert exported.status_code == 200
        parts.append(b"".join(exported.streaming_content).decode())
    return "\n".join(parts)


# --- key digests --------------------------------------------------------------------------------


def test_a_key_digest_is_an_hmac_under_the_server_secret_not_a_plain_sha256(settings):
    key = "order-2026-0042"

    digest = keys.key_digest(key)

    assert digest != hashlib.sha256(key.encode()).hexdigest()[:16]
    secret = conf().key_digest_secret.get_secret_value().encode()
    assert digest == hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16]
    # another secret, another digest: a dictionary of keys is useless without the secret
    override_conf(settings, key_digest_secret="another secret")
    assert keys.key_digest(key) != digest


def test_the_default_secret_is_derived_from_the_django_secret_key_with_its_own_label(settings):
    from idemops.settings import derived_secret

    assert conf().key_digest_secret.get_secret_value() == derived_secret("idemops:key-digest")
    assert settings.SECRET_KEY not in conf().key_digest_secret.get_secret_value()


def test_the_key_forwarded_downstream_is_made_from_the_operation_not_from_the_callers_key():
    operation = uuid.uuid4()

    forwarded = engine.downstream_key(operation)

    assert forwarded == engine.downstream_key(operation) == f"idemops-{operation.hex}"
    assert forwarded != engine.downstream_key(uuid.uuid4())


@pytest.mark.django_db
@pytest.mark.parametrize("secret", ["short", "s" * 64, "a much longer secret than one SHA-256 block " * 3])
def test_the_database_computes_the_same_digest_as_the_server(secret, tenant, settings):
    override_conf(settings, key_digest_secret=secret)
    raw_keys = ["a", "order-2026-0042", "jane.roe:2026-03-01_x", "K" * 255]
    for key in raw_keys:
        make_record(tenant, key=key)

    in_sql = dict(IdempotencyRecord.objects.annotate(
        d=keys.HmacSha256Hex("key", keys.key_digest_secret())).values_list("key", "d"))

    assert in_sql == {key: keys.keyed_hash(key) for key in raw_keys}


@pytest.mark.django_db
def test_the_same_key_in_two_tenants_shows_the_digest_the_server_computes_in_the_api_and_the_admin(
        tenant, other_tenant):
    acme = make_record(tenant, key="jane.roe@example.com")
    globex = make_record(other_tenant, key="jane.roe@example.com")
    expected = keys.key_digest("jane.roe@example.com")

    for auditor_tenant, record in ((tenant, acme), (other_tenant, globex)):
        body = key_client(auditor_tenant).get(f"{RECORDS}/{record.pk}").json()
        assert body["key_digest"] == expected
    admin = superuser_client()
    for record in (acme, globex):
        page = admin.get(reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk])).content.decode()
        assert expected in page and "jane.roe@example.com" not in page
    listing = admin.get(reverse("admin:tools_app_idempotencyrecord_changelist")).content.decode()
    assert listing.count(expected) == 2


@pytest.mark.django_db
def test_the_unknown_outcomes_page_shows_the_key_as_the_same_digest(tenant):
    record = make_record(tenant, key="jane.roe@example.com", status=RecordStatus.UNKNOWN)

    page = superuser_client().get(reverse("admin:tools_app_unknownoutcomequeue_change", args=[record.pk]))

    assert page.status_code == 200
    assert keys.key_digest("jane.roe@example.com") in page.content.decode()
    assert "jane.roe@example.com" not in page.content.decode()


@pytest.mark.django_db
def test_the_api_filter_finds_a_record_by_its_keyed_digest_and_not_by_the_plain_hash(tenant):
    wanted = make_record(tenant, key="order-2026-0042")
    make_record(tenant, key="order-2026-0043")
    client = key_client(tenant)

    found = client.get(RECORDS, {"key_digest": keys.key_digest("order-2026-0042")}).json()["results"]
    plain = client.get(RECORDS, {"key_digest": hashlib.sha256(b"order-2026-0042").hexdigest()[:16]}).json()

    assert [row["id"] for row in found] == [wanted.pk]
    assert plain["results"] == []


# --- failure text ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failure_message_of_a_record_appears_in_no_export_json_or_csv(downstreams, gateway, tenant):
    # given a payment the gateway rejects with a recognisable message, which the record keeps for operators
    gateway.set_fault("*", "reject", times=1)
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    result = call_labelled(caller, "request_payment", {
        "amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "idempotency_key": "p-reject"})
    assert result.error.error_class == "invalid_input" and "payee account closed" in result.error.message
    record = IdempotencyRecord.objects.get(tool="request_payment")
    assert "payee account closed" in record.error_message
    assert AuditEvent.objects.filter(action="record.failed", reason__contains="payee account closed").exists()

    # when an auditor reads every endpoint, as JSON and as CSV
    exported = everything_exported(key_client(tenant))

    # then the message is nowhere, and both the record and its event say it was withheld
    assert "payee account closed" not in exported
    row = key_client(tenant).get(f"{RECORDS}/{record.pk}").json()
    assert (row["error_class"], row["error_message"]) == ("invalid_input", redaction.WITHHELD)
    event = key_client(tenant).get("/api/v1/audit-events", {"action": "record.failed"}).json()["results"][0]
    assert event["reason"] == redaction.WITHHELD


@pytest.mark.django_db
def test_a_persons_reason_is_exported_and_text_an_agent_or_the_system_wrote_is_withheld(tenant):
    make_event(tenant, action="record.force_expired", actor="user:alice", reason="customer asked, ticket 4711")
    make_event(tenant, action="task.cancelled", actor="agent:acme/bot", reason="Jane Roe changed her mind")
    make_event(tenant, action="outbox.dead_lettered", actor="system:outbox-relay", reason="550 jane@example.com")
    make_event(tenant, action="record.succeeded", actor="agent:acme/bot", reason="")

    rows = key_client(tenant).get("/api/v1/audit-events", {"object_type": "idempotencyrecord"}).json()["results"]

    assert {row["action"]: row["reason"] for row in rows} == {
        "record.force_expired": "customer asked, ticket 4711",
        "task.cancelled": redaction.WITHHELD,
        "outbox.dead_lettered": redaction.WITHHELD,
        "record.succeeded": "",
    }


# --- document URLs ---------------------------------------------------------------------------------


@pytest.fixture
def doc_server(settings):
    server = DocServer()
    override_conf(settings, document_allowed_url_prefixes=[server.base_url], task_call_wait_seconds=0)
    yield server
    server.close()


def ingest_by_url(caller, url: str, key: str = "doc-1") -> Task:
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ingest_document", "arguments": {"url": url}, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def test_a_url_token_is_used_for_the_fetch_and_stored_shown_or_exported_nowhere(transactional_db, tenant,
                                                                                 doc_server):
    # given a document behind a signed URL
    url = doc_server.serve("guide.txt?token=SECRET-7f3a", b"The crane schedule moved.\n\nPallets wait.")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")

    # when an agent ingests it and a worker runs the task
    task = ingest_by_url(caller, url)
    outcome = task_jobs.run_task(str(task.pk))

    # then the worker fetched the URL the caller gave, token included
    task.refresh_from_db()
    assert outcome == "succeeded" and task.status == TaskStatus.SUCCEEDED
    assert doc_server.hits == {"/docs/guide.txt?token=SECRET-7f3a": 1}
    # and what is stored holds the URL without its query, and the token nowhere in the clear
    public = doc_server.base_url + "guide.txt"
    record = IdempotencyRecord.objects.get(key="doc-1")
    assert record.arguments["arguments"]["url"] == public and task.arguments["url"] == public
    assert task.result["source"] == public and Document.objects.get().source == public
    stored = [json.dumps(record.arguments), json.dumps(record.result), json.dumps(record.evidence),
              json.dumps(task.arguments), json.dumps(task.result), task.sealed_arguments,
              *Checkpoint.objects.values_list("output_inline", flat=True),
              *(json.dumps([e.before, e.after, e.reason]) for e in AuditEvent.objects.all())]
    assert not [text for text in stored if "SECRET-7f3a" in text]
    # nor in any export, nor on the admin pages of the record, the task and the document
    assert "SECRET-7f3a" not in everything_exported(key_client(tenant))
    admin = superuser_client()
    for page in (reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk]),
                 reverse("admin:tools_app_task_change", args=[task.pk]),
                 reverse("admin:idemops_demo_document_change", args=[Document.objects.get().pk])):
        response = admin.get(page)
        assert response.status_code == 200 and "SECRET-7f3a" not in response.content.decode(), page


def test_a_retry_with_the_same_signed_url_replays_and_another_token_is_a_conflict(transactional_db, tenant,
                                                                                   doc_server):
    url = doc_server.serve("a.txt?token=one", b"Alpha text.")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    task = ingest_by_url(caller, url)

    again = call_tool(get_tool("start_task"), caller,
                      {"tool": "ingest_document", "arguments": {"url": url}, "idempotency_key": "doc-1"})
    other = call_tool(get_tool("start_task"), caller, {
        "tool": "ingest_document", "arguments": {"url": url.replace("one", "two")}, "idempotency_key": "doc-1"})

    # the fingerprint covers the full URL, although only its public form is stored
    assert again.replayed and again.result["task_id"] == str(task.pk)
    assert other.error.error_class == "conflict" and other.error.differing_fields == ["arguments"]


def test_a_task_sealed_under_a_rotated_secret_key_opens_with_the_fallback_and_fails_clearly_without(
        transactional_db, tenant, doc_server, settings):
    url = doc_server.serve("b.txt?sig=abc", b"Beta text.")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    old_key = settings.SECRET_KEY
    first = ingest_by_url(caller, url, key="doc-rotated")
    second = ingest_by_url(caller, url, key="doc-lost")

    settings.SECRET_KEY = "a new secret key after rotation"
    settings.SECRET_KEY_FALLBACKS = [old_key]
    assert task_jobs.run_task(str(first.pk)) == "succeeded"
    settings.SECRET_KEY_FALLBACKS = []
    assert task_jobs.run_task(str(second.pk)) == "failed"

    second.refresh_from_db()
    assert second.failure_class == "invalid_input" and "SECRET_KEY_FALLBACKS" in second.failure_reason
    assert doc_server.hits == {"/docs/b.txt?sig=abc": 1}


@pytest.mark.parametrize(("value", "expected"), [
    ("https://docs.example.com/a.pdf?token=s3cret#p2", "https://docs.example.com/a.pdf"),
    ("https://user:pw@docs.example.com/a.pdf", "https://docs.example.com/a.pdf"),
    ("http://[::1]:8080/x?y=1", "http://[::1]:8080/x"),
    ("https://docs.example.com/plain.pdf", "https://docs.example.com/plain.pdf"),
    ("see https://x.example/?q=1 for details", "see https://x.example/?q=1 for details"),  # prose stays as is
    ("not a url?token=1", "not a url?token=1"),
])
def test_scrubbing_reduces_urls_to_their_public_form_and_leaves_other_text_alone(value, expected):
    assert redaction.scrub_urls({"nested": [{"url": value}]}) == {"nested": [{"url": expected}]}


@pytest.mark.django_db
def test_a_record_stores_its_arguments_without_url_secrets_for_every_tool(tenant):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    result = call_tool(get_tool("create_ticket"), caller, {
        "subject": "Broken link", "body": "https://files.example.com/x.pdf?token=SECRET-9", "idempotency_key": "t-1"})
    assert result.error is None, result.error

    record = IdempotencyRecord.objects.get(key="t-1")
    assert record.status == RecordStatus.SUCCEEDED
    assert record.arguments["body"] == "https://files.example.com/x.pdf"
