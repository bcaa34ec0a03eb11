"""Helpers for the auditors' API tests: rows with chosen attributes, and clients that hold a key."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime, timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from tools_app.access import auditors
from tools_app.models import (
    ApprovalRequest,
    AuditEvent,
    Checkpoint,
    IdempotencyRecord,
    OutboxEvent,
    RecordStatus,
    Task,
    TaskStatus,
    Tenant,
)

ENDPOINTS = ["idempotency-records", "audit-events", "approval-requests", "outbox-events", "tasks", "checkpoints"]


def at(minutes: float) -> datetime:
    """A fixed point in time, `minutes` after T0."""
    return datetime(2026, 3, 1, 12, 0, tzinfo=timezone.get_current_timezone()) + timedelta(minutes=minutes)


def make_record(tenant: Tenant, *, tool: str = "create_order", status: str = RecordStatus.SUCCEEDED,
                created_at: datetime | None = None, finished_at: datetime | None = None, error_class: str = "",
                actor: str = "agent:test/bot", key: str | None = None,
                arguments: dict | None = None) -> IdempotencyRecord:
    created_at = created_at or timezone.now()
    if finished_at is None and status in (RecordStatus.SUCCEEDED, RecordStatus.FAILED):
        finished_at = created_at + timedelta(seconds=1)
    arguments = arguments or {"customer": "Jane Roe", "currency": "EUR"}
    return IdempotencyRecord.objects.create(
        tenant=tenant, tool=tool, key=key or f"key-{uuid.uuid4().hex}", fingerprint="f" * 64,
        field_digests={name: "d" * 64 for name in arguments}, arguments=arguments, status=status,
        result={"order_id": 1} if status == RecordStatus.SUCCEEDED else None, error_class=error_class,
        operation_id=uuid.uuid4(), actor=actor, created_at=created_at, updated_at=created_at,
        finished_at=finished_at, expires_at=created_at + timedelta(days=1))


def make_event(tenant: Tenant | None, *, action: str = "record.succeeded", actor: str = "agent:test/bot",
               created_at: datetime | None = None, reason: str = "", object_id: str = "1") -> AuditEvent:
    return AuditEvent.objects.create(
        tenant=tenant, actor=actor, action=action, object_type="idempotencyrecord", object_id=object_id,
        before={"status": "processing"}, after={"status": "succeeded"}, reason=reason,
        created_at=created_at or timezone.now())


def make_approval_request(tenant: Tenant, **kwargs) -> ApprovalRequest:
    record = make_record(tenant, tool="request_payment", status=RecordStatus.AWAITING_APPROVAL)
    now = timezone.now()
    return ApprovalRequest.objects.create(
        tenant=tenant, record=record, fingerprint=record.fingerprint, tool=record.tool,
        arguments={"payee": "Jane Roe"}, summary="Pay 500 EUR to Jane Roe", amount=500, currency="EUR",
        requested_by="agent:test/bot", created_at=now, expires_at=now + timedelta(hours=1), **kwargs)


def make_outbox_event(tenant: Tenant, **kwargs) -> OutboxEvent:
    now = timezone.now()
    return OutboxEvent.objects.create(tenant=tenant, kind="notification.email", next_attempt_at=now, created_at=now,
                                      payload={"recipient": "jane@example.com", "subject": "s", "body": "b"},
                                      **kwargs)


def make_task(tenant: Tenant, **kwargs) -> Task:
    now = timezone.now()
    record = make_record(tenant, tool="ingest_document")
    return Task.objects.create(tenant=tenant, record=record, tool="ingest_document", arguments={"text": "Jane Roe"},
                               input_digest="d" * 64, status=TaskStatus.SUCCEEDED, steps_total=6, max_attempts=5,
                               created_at=now, updated_at=now, finished_at=now, **kwargs)


def make_checkpoint(tenant: Tenant, **kwargs) -> Checkpoint:
    return Checkpoint.objects.create(task=make_task(tenant), step="extract_text", sequence=2, input_digest="i" * 64,
                                     output_inline='{"text": "Jane Roe"}', checksum="c" * 64,
                                     finished_at=timezone.now(), **kwargs)


def make_row(endpoint: str, tenant: Tenant, **kwargs):
    maker = {"idempotency-records": make_record, "audit-events": make_event,
             "approval-requests": make_approval_request, "outbox-events": make_outbox_event,
             "tasks": make_task, "checkpoints": make_checkpoint}[endpoint]
    return maker(tenant, **kwargs)


def key_client(*tenants: Tenant, name: str | None = None) -> APIClient:
    """A client authenticated by a fresh auditor key granted to `tenants`."""
    _, raw = auditors.issue_key(name or f"auditor-{uuid.uuid4().hex[:8]}", list(tenants), actor="system:test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.raw_key = raw
    return client


def ids(response) -> list:
    """The ids of a page, as the JSON gives them (ints, or strings for UUID keys)."""
    return [row["id"] for row in response.json()["results"]]


def pk_of(row) -> int | str:
    """A row's id as the JSON gives it."""
    return row.pk if isinstance(row.pk, int) else str(row.pk)


def all_pages(client: APIClient, url: str, params: dict | None = None) -> list[int]:
    """Follow `next` links from the first page to the last; the ids in the order served."""
    response = client.get(url, params or {})
    assert response.status_code == 200, response.content
    seen = ids(response)
    while response.json()["next"]:
        response = client.get(response.json()["next"])
        assert response.status_code == 200, response.content
        seen += ids(response)
    return seen


def csv_rows(response) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()
    return list(csv.DictReader(io.StringIO(body)))


def csv_lines(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))
