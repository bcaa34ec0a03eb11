"""Finding records by what people quote: an idempotency key, its digest, or the key we sent downstream.

Reads only; the one place that knows how a key is stored and how the downstream key is derived
(transitions.downstream_key), so a search built on it keeps working if either changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db.models import QuerySet

from tools_app.core import keys
from tools_app.engine.models import IdempotencyRecord
from tools_app.engine.transitions import downstream_key


def records_with_key(key: str, *, tenant_ids: Iterable[int], tools: Iterable[str]) -> QuerySet:
    """The records (live and retired) of `key` under each candidate tenant and tool.

    The unique index on (tenant, tool, key) answers the live record of each pair, and
    record_retired_key the retired ones; the raw key is only compared in the database, never
    kept (callers show `keys.key_digest(key)`).
    """
    candidates = IdempotencyRecord.objects.filter(tenant_id__in=list(tenant_ids), tool__in=list(tools), key=key)
    return candidates.filter(retired_at__isnull=True) | candidates.filter(retired_at__isnull=False)


def records_with_key_digest(digest: str, records: QuerySet | None = None) -> QuerySet:
    """The records whose key has this digest (a scan of `records`: narrow it by tenant or tool first)."""
    return keys.with_key_digest(IdempotencyRecord.objects.all() if records is None else records, digest)


def operation_id_of(sent_key: str) -> uuid.UUID | None:
    """The operation a downstream key was derived from (transitions.downstream_key), or None."""
    try:
        candidate = uuid.UUID(hex=sent_key[-32:])
    except ValueError:
        return None
    return candidate if downstream_key(candidate) == sent_key else None
