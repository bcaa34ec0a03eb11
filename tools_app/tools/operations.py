"""`prepare_operation` (write) and `get_operation` (read): operations as an agent names and looks them up.

For a high-risk tool (ToolSpec.requires_operation_id: request_payment, delete_record,
publish_announcement) the server, not the model, names the operation: prepare_operation issues
an operation id bound to (tenant, tool, business arguments) and the agent carries it verbatim as
the tool's idempotency_key (tools_app.engine.prepared). get_operation answers what became of
any operation, by its operation_id (every write answer's `idempotency.operation_id`, also on
`in_progress`) or by (tool, idempotency_key): the handle a waiting caller holds can be asked
about without calling the tool again.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from pydantic import BaseModel, Field, model_validator

from tools_app import approvals, engine
from tools_app.conf import conf
from tools_app.core import clock, keys
from tools_app.core.errors import ErrorClass, InvalidInput, NotFound, ToolFailure
from tools_app.core.keys import FINGERPRINT_FILLED
from tools_app.engine.models import IdempotencyRecord, PreparedOperation, RecordStatus
from tools_app.tasks import agent_view
from tools_app.tasks.models import Task
from tools_app.toolkit.calls import checked_arguments
from tools_app.toolkit.registry import (
    Retention,
    ToolContext,
    ToolInput,
    ToolSpec,
    WriteInput,
    all_tools,
    get_tool,
    read_tool,
    write_tool,
)

PREPARE_OPERATION = "prepare_operation"


# --- prepare_operation -------------------------------------------------------------------------


class PrepareOperationInput(WriteInput):
    tool: str = Field(min_length=1, max_length=100,
                      description="The high-risk tool the operation is for (tools/list marks it with _meta "
                                  "io.idemops/requires-operation-id).")
    arguments: dict[str, Any] = Field(description="The arguments that tool will be called with, without "
                                                  "idempotency_key (the operation id is the key).")


class PreparedOutput(BaseModel):
    operation_id: str = Field(description="Call the tool with this as its idempotency_key, verbatim.")
    tool: str
    expires_at: datetime = Field(description="Use it for a first call before this; after its first call it is "
                                             "that operation's key.")


def requiring_tools() -> list[str]:
    return sorted(spec.name for spec in all_tools() if spec.requires_operation_id)


def target_call(args: PrepareOperationInput) -> tuple[ToolSpec, BaseModel]:
    """The tool the operation is for, and its arguments validated (and checked) as that tool's own."""
    try:
        spec = get_tool(args.tool)
    except NotFound:
        spec = None
    if spec is None or not spec.requires_operation_id:
        what = "is not a tool" if spec is None else "does not take an issued operation id (any key will do)"
        raise InvalidInput(f"tool: {args.tool!r} {what}; tools that do: {', '.join(requiring_tools())}")
    if "idempotency_key" in args.arguments:
        raise InvalidInput("arguments.idempotency_key: leave it out; the operation_id answered is the key")
    return spec, checked_arguments(spec, {**args.arguments, "idempotency_key": args.idempotency_key})


def check_prepare(args: PrepareOperationInput) -> None:
    """Before the prepare call's key is claimed: the tool takes issued ids, and the arguments suit it."""
    target_call(args)


def prepared_arguments(args: PrepareOperationInput, version: int) -> dict[str, Any]:
    """What a prepare call's fingerprint covers: the tool and its business arguments (a re-worded note
    or another trace id asks for the same operation), as the tool's own fingerprint covers them (all
    filled in under version 1, as before versions)."""
    spec, validated = target_call(args)
    inner = FINGERPRINT_FILLED if version == FINGERPRINT_FILLED else spec.fingerprint_version
    return {"tool": spec.name, "arguments": spec.business_arguments(validated, inner)}


def id_ttl() -> timedelta:
    return timedelta(seconds=conf().operation_id_ttl_seconds)


@write_tool(name=PREPARE_OPERATION, title="Prepare a high-risk operation", check=check_prepare,
            operation_arguments=prepared_arguments, retention=Retention(key=id_ttl),
            # The high-risk call's own arguments (a payee, a reason, an announcement's text).
            personal_fields=frozenset({"arguments"}))
def prepare_operation(ctx: ToolContext, args: PrepareOperationInput) -> PreparedOutput:
    """Get the operation id a high-risk tool (tools/list marks them with _meta
    io.idemops/requires-operation-id) must be called with as its idempotency_key: those
    tools refuse any other key. Give the tool and the exact arguments you will call it with. Calling
    prepare_operation again with the same idempotency_key and arguments answers the same id, so retrying is safe;
    other arguments with that key are a `conflict`. Use the id within expires_at; then call the tool with it, and
    on every retry of that call."""
    spec, validated = target_call(args)
    prepared = engine.issue(ctx.record, tool=spec.name, covered=partial(spec.business_arguments, validated),
                            fingerprint_version=spec.fingerprint_version, actor=ctx.actor)
    return PreparedOutput(operation_id=str(prepared.operation_id), tool=spec.name,
                          expires_at=ctx.record.expires_at)


# --- get_operation -----------------------------------------------------------------------------


class GetOperationInput(ToolInput):
    operation_id: str | None = Field(None, max_length=64, description="An operation id: `idempotency.operation_id` "
                                                                      "of any write answer, or prepare_operation's.")
    tool: str | None = Field(None, max_length=100, description="With idempotency_key: the tool called.")
    idempotency_key: str | None = Field(None, max_length=255, description="With tool: the key it was called with.")

    @model_validator(mode="after")
    def _one_form(self) -> GetOperationInput:
        by_key = self.tool is not None or self.idempotency_key is not None
        if (self.operation_id is None) == (not by_key) or (by_key and None in (self.tool, self.idempotency_key)):
            raise ValueError("give either operation_id, or tool and idempotency_key")
        return self


class OperationView(BaseModel):
    operation_id: str
    tool: str
    status: str = Field(description="succeeded, failed, processing, unknown or awaiting_approval")
    result: dict[str, Any] | None = Field(description="The first call's result once succeeded (what a retry with "
                                                      "the key answers, without the idempotency block)")
    error: dict[str, Any] | None = Field(description="The error once FAILED; while waiting, what a call would be "
                                                     "told ({class, message, retry_after?, ...}); else null")
    expires_at: datetime | None = Field(description="End of the key's retention; null while the first call has "
                                                    "not committed, and while the task a long tool's operation "
                                                    "started is unfinished (its end starts the retention)")
    task_id: str | None = Field(default=None, description="The task a long tool's operation runs as")


@read_tool(name="get_operation", title="Get an operation's state", personal_fields=frozenset())
def get_operation(ctx: ToolContext, args: GetOperationInput) -> OperationView:
    """What became of an operation, without calling its tool again: by operation_id (every write answer carries
    it in `idempotency.operation_id`, also an in_progress answer), or by tool and idempotency_key. Answers its
    status and, once succeeded, its result (for a long tool, one with a task: processing until its task
    ends, then the task's result). not_found: no such operation in this tenant, or its key was freed after its
    retention."""
    if args.operation_id is not None:
        return _by_operation_id(ctx.tenant_id, args.operation_id)
    assert args.tool is not None and args.idempotency_key is not None  # GetOperationInput._one_form
    return _by_key(ctx.tenant_id, args.tool, args.idempotency_key)


def _by_operation_id(tenant_id: int, given: str) -> OperationView:
    """get_operation by operation_id (`given` as the caller wrote it)."""
    operation_id = _uuid(given)
    record = _live(tenant_id, operation_id=operation_id)
    if record is None:
        if operation_id is not None and (tool := engine.claimed_in_flight(
                tenant_id, operation_id, [spec.name for spec in all_tools() if spec.writes])):
            return _in_flight_view(operation_id, tool)
        # Committed since we looked (its claim's lock is gone), or not there at all.
        record = _live(tenant_id, operation_id=operation_id)
    if record is None:
        raise _not_found(tenant_id, given)
    return _view(record, as_long_tool=record.tool == agent_view.START_TASK)


def _by_key(tenant_id: int, tool: str, key: str) -> OperationView:
    """get_operation by tool and idempotency_key."""
    try:
        spec = get_tool(tool)
    except NotFound:
        raise NotFound(f"tool: no tool {tool!r}") from None
    if spec.pipeline is not None:
        # A long tool called directly is the start_task operation for it (one key space, one task).
        found = _live_or_in_flight(tenant_id, agent_view.START_TASK, key, shown_as=spec.name)
        if isinstance(found, OperationView):
            return found
        if found is None or found.arguments.get("tool") != spec.name:
            raise _not_found(tenant_id, key)
        return _view(found, as_long_tool=True)
    found = _live_or_in_flight(tenant_id, spec.name, key, shown_as=spec.name)
    if isinstance(found, OperationView):
        return found
    if found is None:
        raise _not_found(tenant_id, key)
    return _view(found, as_long_tool=False)


def _live_or_in_flight(tenant_id: int, tool: str, key: str, *, shown_as: str
                       ) -> IdempotencyRecord | OperationView | None:
    """The key's live record; else, while another call's claim of it is uncommitted (a local tool's
    first call, still in its transaction), that operation as PROCESSING; else None."""
    record = _live(tenant_id, tool=tool, key__in=keys.stored_forms(key))
    if record is not None:
        return record
    operation_id = engine.claim_operation_id(tenant_id, tool, key)
    if engine.claimed_in_flight(tenant_id, operation_id, [tool]):
        return _in_flight_view(operation_id, shown_as)
    # Committed since we looked (its claim's lock is gone).
    return _live(tenant_id, tool=tool, key__in=keys.stored_forms(key))


def _in_flight_view(operation_id: uuid.UUID, tool: str) -> OperationView:
    """An operation whose first call has claimed its key and not committed yet: all there is to say."""
    return OperationView(operation_id=str(operation_id), tool=tool, status=RecordStatus.PROCESSING, result=None,
                         error=None, expires_at=None)


def _live(tenant_id: int, **lookup: Any) -> IdempotencyRecord | None:
    if "operation_id" in lookup and lookup["operation_id"] is None:
        return None  # not an id at all
    # With the database's time of the read: a retry_after counted from this host's clock would be off by its skew.
    return (IdempotencyRecord.objects.filter(tenant_id=tenant_id, retired_at__isnull=True, **lookup)
            .annotate(read_at=clock.NOW).first())


def _view(record: IdempotencyRecord, *, as_long_tool: bool) -> OperationView:
    task = Task.objects.filter(record=record).first() if as_long_tool else None
    if task is not None and record.status == RecordStatus.SUCCEEDED:
        return _task_view(record, task)
    return OperationView(operation_id=str(record.operation_id), tool=record.tool, status=record.status,
                         result=record.result if record.status == RecordStatus.SUCCEEDED else None,
                         error=_record_error(record), expires_at=engine.retention_ends_at(record))


def _record_error(record: IdempotencyRecord) -> dict[str, Any] | None:
    """What a call with the key would be told, as the engine's follower tells it."""
    match record.status:
        case RecordStatus.FAILED | RecordStatus.UNKNOWN:
            failure = ToolFailure.from_dict({"class": record.error_class, "message": record.error_message})
            if failure.retryable and record.retry_not_before is not None:
                failure = failure.replaced(
                    retry_after=max(0.0, (record.retry_not_before - clock.read_at(record)).total_seconds()))
            return failure.as_dict()
        case RecordStatus.AWAITING_APPROVAL:
            pending = approvals.follow(record).error
            assert pending is not None  # follow answers with the pending approval
            return pending.as_dict()
    return None


def _task_view(record: IdempotencyRecord, task: Task) -> OperationView:
    """A long tool's operation is its task's: PROCESSING until the task ends, then its result or failure."""
    outcome = agent_view.outcome(get_tool(task.tool), task)
    if outcome.error is None:
        status = RecordStatus.SUCCEEDED
    elif outcome.error.error_class == ErrorClass.IN_PROGRESS:
        status = RecordStatus.PROCESSING
    else:
        status = RecordStatus.FAILED
    return OperationView(operation_id=str(record.operation_id), tool=task.tool, status=status, result=outcome.result,
                         error=outcome.error.as_dict() if outcome.error else None,
                         expires_at=engine.retention_ends_at(record), task_id=str(task.pk))


def _not_found(tenant_id: int, named: str) -> NotFound:
    operation_id = _uuid(named)
    prepared = (PreparedOperation.objects.select_related("record").filter(tenant_id=tenant_id, pk=operation_id)
                .first() if operation_id else None)
    if prepared is not None:
        lapsed = "" if engine.valid_unused(prepared) else " and has expired unused"
        return NotFound(f"operation {named} was issued by prepare_operation for {prepared.tool} but no call has "
                        f"used it yet{lapsed}")
    return NotFound(f"no operation {named} in this tenant (or its key was freed after its retention)")


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None

