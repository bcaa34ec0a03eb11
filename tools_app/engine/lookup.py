"""Finding records by what people quote: an idempotency key, its digest, or the key we sent downstream.

Reads only. A key we sent downstream is turned back into its operation by
claims.operation_id_of, beside claims.downstream_key that derives it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from tools_app.core import keys
from tools_app.engine.models import IdempotencyRecord


def records_with_key(key: str, *, tenant_ids: Iterable[int], tools: Iterable[str]) -> QuerySet[IdempotencyRecord]:
    """The records (live and retired) of `key` under each candidate tenant and tool.

    The unique index on (tenant, tool, key) answers the live record of each pair, and
    record_retired_key the retired ones; the raw key is only compared in the database, never
    kept (callers show `keys.key_digest(key)`).
    """
    candidates = IdempotencyRecord.objects.filter(tenant_id__in=list(tenant_ids), tool__in=list(tools),
                                                   key__in=keys.stored_forms(key))
    return candidates.filter(retired_at__isnull=True) | candidates.filter(retired_at__isnull=False)


def records_with_key_digest(digest: str, records: QuerySet[IdempotencyRecord] | None = None
                            ) -> QuerySet[IdempotencyRecord]:
    """The records whose key has this digest (a scan of `records`: narrow it by tenant or tool first)."""
    return keys.with_key_digest(IdempotencyRecord.objects.all() if records is None else records, digest)
