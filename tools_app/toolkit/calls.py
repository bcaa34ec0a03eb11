"""A tool call, from any entry point: validate, then run it (under the engine for writes).

The MCP server, the tests and the benchmarks all come through `call_tool`,
so there is one place where arguments are checked and a write becomes an
idempotent operation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DataError, models
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from tools_app import engine
from tools_app.core import keys
from tools_app.core.errors import InvalidInput, ToolFailure, invalid_data
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit.hooks import hooks
from tools_app.toolkit.registry import ToolContext, ToolSpec, _no_progress, parse_arguments


class CallOutcome(models.TextChoices):
    EXECUTED = "executed", "Executed (first call)"
    REPLAYED = "replayed", "Replayed a stored result"
    CONFLICT = "conflict", "Key reused with other parameters"
    IN_PROGRESS = "in_progress", "Answered in_progress after waiting"
    FAILED = "failed", "Failed"
    UNKNOWN = "unknown", "Outcome unknown"
    PENDING_APPROVAL = "pending_approval", "Held for a person's approval"
    REJECTED = "rejected", "Rejected before execution (input, auth, expiry)"
    READ = "read", "Read tool"


@dataclass(frozen=True)
class Caller:
    tenant_id: int
    actor: str
    report_progress: Callable[[float, float | None, str | None], None] = _no_progress


@dataclass
class CallResult:
    spec: ToolSpec
    result: dict[str, Any] | None = None
    error: ToolFailure | None = None
    record: IdempotencyRecord | None = None
    replayed: bool = False

    @property
    def outcome(self) -> CallOutcome:
        """How the call counts on the dashboard."""
        if not self.spec.writes:
            return CallOutcome.READ
        if self.error is None:
            return CallOutcome.REPLAYED if self.replayed else CallOutcome.EXECUTED
        return {
            "conflict": CallOutcome.CONFLICT, "in_progress": CallOutcome.IN_PROGRESS,
            "unknown_outcome": CallOutcome.UNKNOWN, "invalid_input": CallOutcome.REJECTED,
            "expired": CallOutcome.REJECTED, "permission_denied": CallOutcome.REJECTED,
            "pending_approval": CallOutcome.PENDING_APPROVAL,
        }.get(self.error.error_class, CallOutcome.FAILED)


def call_tool(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], *, meta_key: str | None = None) -> CallResult:
    try:
        if spec.pipeline is not None:
            # A long tool runs as a task: its call is start_task for it (one key space, one task).
            return hooks.run_long_tool(spec, caller, arguments, meta_key)
        if spec.writes:
            return _call_write(spec, caller, arguments, meta_key)
        args = checked_arguments(spec, arguments)
        context = ToolContext(tenant_id=caller.tenant_id, actor=caller.actor, trace_id=args.trace_id or "",
                              report_progress=caller.report_progress)
        return CallResult(spec, result=dump_result(spec, spec.handler(context, args)))
    except ToolFailure as failure:
        return CallResult(spec, error=failure)
    except DataError as exc:  # past validation (a read, or a claim): nothing was stored
        return CallResult(spec, error=invalid_data(exc))


def _call_write(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None) -> CallResult:
    arguments = with_idempotency_key(arguments, meta_key)
    args = checked_arguments(spec, arguments)
    operation, execute = write_operation(spec, caller, args)
    if spec.requires_operation_id:
        # Before any claim: a key the server did not issue for this call leaves nothing behind.
        operation = dataclasses.replace(operation, operation_id=engine.issued_operation_id(operation))
    outcome = engine.run(operation, execute)
    if outcome.executed and outcome.record.status == RecordStatus.UNKNOWN:
        hooks.after_unknown()
    return CallResult(spec, result=outcome.result, error=outcome.error, record=outcome.record,
                      replayed=outcome.replayed)


def write_operation(spec: ToolSpec, caller: Caller, args: BaseModel) -> tuple[engine.Operation,
                                                                               engine.Executor]:
    """A validated write call as the engine sees it, and its side effect.

    Also used to run an approved call later (tools_app.approvals), with the
    requester as the caller.
    """
    operation = engine.Operation(
        tenant_id=caller.tenant_id, tool=spec.name, key=args.idempotency_key, arguments=spec.business_arguments(args),
        actor=caller.actor, trace_id=args.trace_id or "", retention=spec.retention_now(), on_expiry=spec.on_expiry,
        transactional=spec.transactional,
        approval=hooks.approval_gate(spec, caller.tenant_id, caller.actor, args) if spec.approval else None,
    )

    def execute(record: IdempotencyRecord) -> dict[str, Any]:
        context = ToolContext(tenant_id=caller.tenant_id, actor=caller.actor, trace_id=operation.trace_id,
                              record=record, report_progress=caller.report_progress)
        return dump_result(spec, spec.handler(context, args))

    return operation, execute


def with_idempotency_key(arguments: dict[str, Any], meta_key: str | None) -> dict[str, Any]:
    """Take the key from the arguments or from _meta; it is checked before anything else."""
    key = arguments.get("idempotency_key")
    if key is None and meta_key is None:
        raise InvalidInput(f"idempotency_key is required for write tools (argument or _meta "
                           f"{keys.META_KEY}); {keys.KEY_RULE}")
    if key is not None and meta_key is not None and key != meta_key:
        raise InvalidInput(f"idempotency_key in the arguments and in _meta {keys.META_KEY} differ")
    return {**arguments, "idempotency_key": keys.validate_key(key if key is not None else meta_key)}


def checked_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """The validated arguments of a call, after the tool's own checks: all before any key is claimed."""
    args = validate_arguments(spec, arguments)
    if spec.check is not None:
        spec.check(args)
    return args


def validate_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    try:
        return parse_arguments(spec.input_model, arguments)
    except PydanticSerializationError:
        # Only in-process callers get here (over MCP the SDK's JSON parser refused it first).
        raise InvalidInput(f"invalid arguments for {spec.name}: arguments: not representable as JSON") from None
    except ValidationError as exc:
        # Field names and rules only: the rejected values are the caller's data.
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise InvalidInput(f"invalid arguments for {spec.name}: {problems}") from None


def dump_result(spec: ToolSpec, result: dict[str, Any] | BaseModel) -> dict[str, Any]:
    if not isinstance(result, spec.output_model):
        result = spec.output_model.model_validate(result)
    return result.model_dump(mode="json")
