"""UNKNOWN records made by one bulk INSERT, and a bulk action run as the cluster's workers run it."""

import uuid
from datetime import timedelta

from django.utils import timezone

from tools_app import bulk
from tools_app.models import IdempotencyRecord, RecordStatus


def unknown_records(tenant, n, *, tool="send_notification", attributes=None, created_at=None):
    """`n` UNKNOWN records of `tool`, escalated to a person, in one INSERT."""
    now = created_at or timezone.now()
    return IdempotencyRecord.objects.bulk_create([IdempotencyRecord(
        tenant=tenant, tool=tool, key=f"k-{uuid.uuid4().hex}", fingerprint="f" * 64, arguments={},
        status=RecordStatus.UNKNOWN, error_class="unknown_outcome", operation_id=uuid.uuid4(),
        downstream_key=f"dk-{i}", actor="agent:acme/bot", created_at=now, updated_at=now, escalated_at=now,
        expires_at=now + timedelta(days=1), attributes=attributes or {}) for i in range(n)])


def run_to_the_end(action_id, most=1000):
    """Run its batches as the worker does (each job queues the next) until it is no longer running;
    the progress after each batch."""
    seen = []
    for _ in range(most):
        bulk.run_batch(action_id)
        row = bulk.BulkAction.objects.get(pk=action_id)
        seen.append((row.done, row.failed, row.state))
        if row.state not in (bulk.BulkState.RUNNING, bulk.BulkState.STOPPING):
            return seen
    raise AssertionError(f"still running after {most} batches: {seen[-1]}")
