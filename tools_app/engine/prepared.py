"""Operation ids issued before the call, for tools that take no other key (ToolSpec.requires_operation_id).

For a high-risk operation the business system, not the language model, names the operation:
`issue` (the prepare_operation tool's handler) hands out an id bound to (tenant, tool,
fingerprint of the business arguments); the agent carries it verbatim as the call's key, and
`issued_operation_id` checks it before anything is claimed. The claimed record's operation_id is
the id itself (Operation.operation_id), so the id the agent holds is the one sent downstream, in
the audit events and on the task.

Lifetime of an id:
- unused, it is valid while the prepare call's record is live and within its retention
  (IDEMOPS_OPERATION_ID_TTL_SECONDS): a replay of prepare_operation never answers a lapsed id;
- used, it is its record's key, with the tool's retention and expiry policy;
- once that record is retired (retention ended, or an operator released a held key) the id is
  spent: a new operation needs a new id (engine.claims.claim refuses it too, should the
  record be retired between this check and the claim).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from tools_app.core import clock, keys
from tools_app.core.errors import Conflict, InvalidInput
from tools_app.core.keys import digest
from tools_app.engine.models import IdempotencyRecord, PreparedOperation
from tools_app.engine.operation import OPERATION_ID_REQUIRED, Operation, field_digests, operation_id_spent
from tools_app.engine.transitions import is_expired


def issue(record: IdempotencyRecord, *, tool: str, covered: Callable[[int], dict[str, Any]], fingerprint_version: int,
          actor: str) -> PreparedOperation:
    """The operation id for a call of `tool` with these business arguments (`covered`: as each fingerprint
    version covers them), asked for by the call `record`.

    Runs as the executor of `record` (a prepare_operation call), inside its transaction. If an
    earlier call with the same key issued an id for the same arguments (compared under the version
    that id was issued with) and that id's operation is still within its retention, that id is
    answered again: the prepare record's retention is short, and an agent that lost its ledger must
    not get a second id, so a second payment, for an operation that already ran.
    """
    arguments = covered(fingerprint_version)
    issued = (PreparedOperation.objects
              .filter(tenant_id=record.tenant_id, tool=tool, record__tool=record.tool,
                      record__key__in=keys.stored_forms(record.key))
              .order_by("-created_at"))
    earlier = next((prepared for prepared in issued
                    if prepared.fingerprint == digest(covered(prepared.fingerprint_version))), None)
    if earlier is not None and _live_operation(earlier.operation_id) is not None:
        return earlier
    return PreparedOperation.objects.create(
        operation_id=uuid.uuid4(), tenant_id=record.tenant_id, tool=tool, fingerprint=digest(arguments),
        fingerprint_version=fingerprint_version, field_digests=field_digests(arguments), record=record, actor=actor,
        created_at=timezone.now())


def issued_operation_id(op: Operation) -> uuid.UUID:
    """The operation id `op.key` is, if it was issued for this tenant, tool and arguments; else the refusal.

    Checked before the claim: a refused key leaves nothing behind. Once used, the id's own
    record answers (replay, in_progress, conflict, ...) as for any key.
    """
    operation_id = _as_operation_id(op.key)
    prepared = (PreparedOperation.objects.select_related("record")
                .filter(pk=operation_id, tenant_id=op.tenant_id, tool=op.tool).first() if operation_id else None)
    if prepared is None:
        raise not_issued(op.tool, "this key is not one")
    used = IdempotencyRecord.objects.filter(operation_id=prepared.operation_id).only("retired_at").first()
    if used is not None:
        if used.retired_at is not None:
            raise operation_id_spent(prepared.operation_id)
        return prepared.operation_id
    if not valid_unused(prepared):
        raise not_issued(op.tool, f"operation id {prepared.operation_id} expired unused")
    if not op.matches(prepared):
        fields = op.differing_fields(prepared)
        raise Conflict(f"operation id {prepared.operation_id} was issued for other arguments (differing: "
                       f"{', '.join(fields)}); prepare a new operation for these", differing_fields=fields)
    return prepared.operation_id


def valid_unused(prepared: PreparedOperation) -> bool:
    """An id nobody used yet may be used while the record of the call that issued it is live and not expired."""
    prepare_record = prepared.record
    # By the database's clock (tools_app.core.clock), like every expiry: hosts' clocks disagree.
    return prepare_record.retired_at is None and prepare_record.expires_at > clock.read()


def not_issued(tool: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"{tool} takes as its idempotency_key only an operation id issued by prepare_operation; {why}. Call "
        f"prepare_operation with tool={tool!r} and the arguments, then call {tool} again with the operation_id it "
        "answers", details={OPERATION_ID_REQUIRED: True})


def _as_operation_id(key: str) -> uuid.UUID | None:
    """The id a key spells, in the one form it was issued in (a different spelling would be another key)."""
    try:
        operation_id = uuid.UUID(key)
    except ValueError:
        return None
    return operation_id if str(operation_id) == key else None


def _live_operation(operation_id: uuid.UUID) -> IdempotencyRecord | None:
    record = IdempotencyRecord.objects.filter(operation_id=operation_id, retired_at__isnull=True).first()
    return record if record is not None and not is_expired(record) else None
