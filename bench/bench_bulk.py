"""Bulk recovery: P18, seconds for a bulk action over 10,000 UNKNOWN records to finish.

The records are made by one INSERT (as an outage leaves them: UNKNOWN, escalated to a person); an
operator (a real user of the operators' role, with a second factor) confirms "Resolve as not done"
over all of them (tools_app.bulk.start: the count, the frozen selection, the audit event), then its
batches run as a django-q2 worker runs them (tools_app.bulk.run_batch, each job queuing the next;
IDEMOPS_BULK_BATCH_SIZE items each), every item through reconciliation.resolve_by_operator with its
permission check and audit event. From the confirmation to the state `done`, by the wall clock.
Run alone with `.venv/bin/python bench/run.py bulk`.
"""

from __future__ import annotations

import os
import time
import uuid

from django.db import connection

from bench.common import Section, at_most
from tests.bulk.support import run_to_the_end, unknown_records
from tests.support.operators import make_operator
from tools_app import access, bulk
from tools_app.access.roles import OPERATOR
from tools_app.conf import conf
from tools_app.models import IdempotencyRecord, RecordStatus

RUN = uuid.uuid4().hex[:8]
TARGET_SECONDS = 300


def run(quick: bool = False) -> Section:
    size = 300 if quick else 10_000
    tenant = access.create_tenant(f"bench-bulk-{RUN}")
    operator = make_operator(f"bench-bulk-{RUN}", OPERATOR, tenant)
    made = time.monotonic()
    unknown_records(tenant, size)
    insert_seconds = time.monotonic() - made
    started = time.monotonic()
    action = bulk.start(operator, bulk.Filter(target=bulk.Target.UNKNOWN, tenant=tenant.slug), "resolve_not_done",
                        reason="benchmark: the gateway's log shows none of them arrived")
    confirm_seconds = time.monotonic() - started
    progress = run_to_the_end(action.pk)
    seconds = time.monotonic() - started
    action.refresh_from_db()
    left = IdempotencyRecord.objects.filter(tenant=tenant, status=RecordStatus.UNKNOWN).count()
    assert action.state == bulk.BulkState.DONE and action.done == size and left == 0, (
        action, action.done, action.failed, size, left, list(IdempotencyRecord.objects.filter(
            tenant=tenant, status=RecordStatus.UNKNOWN).values_list("tool", "key", "created_at"))[:3],
        list(bulk.BulkItem.objects.filter(bulk=action, outcome="failed").values_list("message", flat=True))[:3])
    p18 = at_most("P18", f"bulk action over {size:,} UNKNOWN records: seconds to finish", [seconds],
                  TARGET_SECONDS, unit=" s", records=size, batches=len(progress),
                  batch_size=conf().bulk_batch_size, confirm_seconds=round(confirm_seconds, 3))
    markdown = f"""## Bulk recovery (P18)

{os.cpu_count()} cores, PostgreSQL {connection.pg_version // 10000}. {size:,} UNKNOWN records made by one
INSERT ({insert_seconds:.2f} s); one operator confirms "Resolve as not done" over all of them (count,
frozen selection and audit event: {confirm_seconds:.2f} s), then {len(progress)} batches of
`IDEMOPS_BULK_BATCH_SIZE` = {conf().bulk_batch_size} run one after another as a worker runs them, each item
through `reconciliation.resolve_by_operator` (permission check, guarded transition, audit event).

| records | batches | seconds to finish | records/s | left UNKNOWN |
| ---: | ---: | ---: | ---: | ---: |
| {size:,} | {len(progress)} | {seconds:.2f} | {size / seconds:,.0f} | {left} |
"""
    return Section(markdown, [p18])
