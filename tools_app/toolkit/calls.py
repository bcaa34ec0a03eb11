"""A tool call, from any entry point: validate, then run it (under the engine for writes).

The MCP server, the tests and the benchmarks all come through `start_call`
(or `call_tool`, which waits in its thread), so there is one place where
arguments are checked and a write becomes an idempotent operation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DataError, models
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from tools_app import engine, incidents
from tools_app.conf import conf
from tools_app.core import keys, logs, polling, redaction, tracing
from tools_app.core.errors import InvalidInput, ToolFailure, invalid_data
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit.hooks import hooks
from tools_app.toolkit.registry import Handler, ToolContext, ToolSpec, WriteInput, _no_progress, parse_arguments


class CallOutcome(models.TextChoices):
    """How a call counts (`idemops_tool_calls_total{outcome}`, the dashboard)."""

    EXECUTED = "executed", "Executed (a write's first call, or a read)"
    REPLAYED = "replayed", "Replayed a stored result"
    CONFLICT = "conflict", "Key reused with other parameters"
    IN_PROGRESS = "in_progress", "Answered in_progress after waiting"
    UNKNOWN = "unknown", "Outcome unknown"
    FAILED = "failed", "Failed"
    REJECTED = "rejected", "Rejected before execution (input, permission, not found)"
    PENDING_APPROVAL = "pending_approval", "Held for a person's approval"
    EXPIRED = "expired", "Key past its retention, held for a person"
    RATE_LIMITED = "rate_limited", "Refused by a rate limit"


# Error classes and the outcome they count as; any other class (transient, downstream_conflict,
# already_done, ...) is `failed`.
OUTCOME_OF_ERROR = {
    "conflict": CallOutcome.CONFLICT, "in_progress": CallOutcome.IN_PROGRESS, "unknown_outcome": CallOutcome.UNKNOWN,
    "invalid_input": CallOutcome.REJECTED, "permission_denied": CallOutcome.REJECTED,
    "not_found": CallOutcome.REJECTED, "pending_approval": CallOutcome.PENDING_APPROVAL,
    "expired": CallOutcome.EXPIRED, "rate_limited": CallOutcome.RATE_LIMITED,
}


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
        """How the call counts (metrics, the dashboard, its log line)."""
        if self.error is None:
            return CallOutcome.REPLAYED if self.replayed else CallOutcome.EXECUTED
        return OUTCOME_OF_ERROR.get(self.error.error_class, CallOutcome.FAILED)


def call_tool(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], *, meta_key: str | None = None,
              confirming: Any = None) -> CallResult:
    """One call, waiting in this thread wherever it waits (see `start_call`)."""
    return polling.settle(start_call(spec, caller, arguments, meta_key=meta_key, confirming=confirming))


def start_call(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], *, meta_key: str | None = None,
               confirming: Any = None) -> CallResult | polling.Pending[CallResult]:
    """One call: its result, or a handle on what it waits for (a follower for its executor, a caller
    for its task) that goes on from there (core.polling). `confirming` (approvals.confirmations.Confirming): the
    call came through an MCP host that can ask its person, so a tool with a confirmation rule asks
    first (see toolkit.hooks.confirm). In a span of its own (in the caller's trace,
    or a new one) whose ids the records it writes keep; every line logged meanwhile names the tenant
    and tool and shows neither the raw key nor the tool's personal arguments (core.logs.scrubbing)."""
    raw_key = arguments.get("idempotency_key") if isinstance(arguments, dict) else None
    client_trace_id = arguments.get("trace_id") if isinstance(arguments, dict) else None
    span = tracing.opened(f"tool {spec.name}", **{"idemops.tool": spec.name, "idemops.tenant_id": caller.tenant_id})

    def scope() -> ExitStack:
        stack = ExitStack()
        stack.enter_context(tracing.current(span))
        stack.enter_context(observed(spec, caller.tenant_id, arguments,
                                     key=raw_key if isinstance(raw_key, str) else meta_key,
                                     client_trace_id=client_trace_id[:100] if isinstance(client_trace_id, str)
                                     else None))
        return stack

    def ended(result: CallResult) -> CallResult:
        span.set_attribute("idemops.outcome", str(result.outcome))
        if result.error is not None:
            span.set_attribute("idemops.error_class", str(result.error.error_class))
        if result.record is not None:
            span.set_attribute("idemops.operation_id", str(result.record.operation_id))
        span.end()
        return result

    try:
        with scope():
            value = _answered(spec, lambda: _call(spec, caller, arguments, meta_key, confirming))
    except BaseException:
        span.end()
        raise
    if isinstance(value, polling.Pending):
        value = value.within(scope)
    return polling.after(value, ended)


@contextmanager
def observed(spec: ToolSpec, tenant_id: int, arguments: Any, *, key: str | None = None,
             **fields: Any) -> Iterator[None]:
    """Work on one call of `spec` (the call itself, its task's steps, its approved execution): every
    line logged inside names the tenant and the tool, and shows neither `key` nor the values of the
    tool's personal arguments. A high-risk tool's key is an operation id the server issued, not
    the caller's words: it stays visible, as the `operation_id` it also is."""
    if spec.requires_operation_id:
        key = None
    with logs.bound(tenant_id=tenant_id, tool=spec.name, **fields), \
            logs.scrubbing(redaction.scrubbed_arguments(arguments if isinstance(arguments, dict) else {},
                                                        spec.personal_fields or (), key=key)):
        yield


def _answered(spec: ToolSpec, call: Callable[[], CallResult | polling.Pending[CallResult]]
              ) -> CallResult | polling.Pending[CallResult]:
    """`call()`, with a refusal (also one after a wait) answered as the call's error."""
    try:
        value = call()
    except ToolFailure as failure:
        return CallResult(spec, error=failure)
    except DataError as exc:  # past validation (a read, or a claim): nothing was stored
        return CallResult(spec, error=invalid_data(exc))
    if isinstance(value, polling.Pending):
        going_on = value.then
        return dataclasses.replace(value, then=lambda: _answered(spec, going_on))
    return value


def _call(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None, confirming: Any = None
          ) -> CallResult | polling.Pending[CallResult]:
    if spec.pipeline is not None:
        # A long tool runs as a task: its call is start_task for it (one key space, one task).
        started: CallResult | polling.Pending[CallResult] = hooks.run_long_tool(spec, caller, arguments, meta_key)
        return started
    if spec.writes:
        return _call_write(spec, caller, arguments, meta_key, confirming)
    args = checked_arguments(spec, arguments)
    trace_id, span_id = tracing.ids()
    context = ToolContext(tenant_id=caller.tenant_id, actor=caller.actor, trace_id=trace_id, span_id=span_id,
                          report_progress=caller.report_progress)
    answer = spec.handler(context, args)
    if isinstance(answer, polling.Pending):  # a read that waits (a task's status with wait_seconds)
        return answer.map(lambda answered: CallResult(spec, result=dump_result(spec, answered)))
    return CallResult(spec, result=dump_result(spec, answer))


def _call_write(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None,
                confirming: Any = None) -> CallResult | polling.Pending[CallResult]:
    return run_write(spec, caller, checked_arguments(spec, with_idempotency_key(arguments, meta_key)),
                     confirming=confirming)


def run_write(spec: ToolSpec, caller: Caller, args: BaseModel, *, handler: Handler | None = None,
              confirming: Any = None) -> CallResult | polling.Pending[CallResult]:
    """A write call whose arguments `checked_arguments` passed, run by the engine (`handler`, if
    given, in place of the tool's own: a long tool's start keeps the task it creates; `confirming`:
    see start_call)."""
    operation, execute = write_operation(spec, caller, args, handler=handler)
    if spec.requires_operation_id:
        # Before any claim: a key the server did not issue for this call leaves nothing behind.
        operation = dataclasses.replace(operation, operation_id=engine.issued_operation_id(operation))
    if confirming is not None and spec.confirmation is not None:
        operation, execute = hooks.confirm(spec, caller.tenant_id, caller.actor, args, operation, execute, confirming)
    with incidents.admission():
        outcome = engine.start(operation, execute)
    if isinstance(outcome, polling.Pending):
        outcome = outcome.within(incidents.admission)  # a follower that runs the key after its wait
    return polling.after(outcome, lambda ended: _write_result(spec, ended))


def _write_result(spec: ToolSpec, outcome: engine.Outcome) -> CallResult:
    if outcome.executed and outcome.record.status == RecordStatus.UNKNOWN:
        hooks.after_unknown()
    return CallResult(spec, result=outcome.result, error=outcome.error, record=outcome.record,
                      replayed=outcome.replayed)


def write_operation(spec: ToolSpec, caller: Caller, args: BaseModel, *, handler: Handler | None = None
                    ) -> tuple[engine.Operation, engine.Executor]:
    """A validated write call as the engine sees it, and its side effect.

    Also used to run an approved call later (tools_app.approvals), with the
    requester as the caller.
    """
    assert isinstance(args, WriteInput), "register() holds every write tool to a WriteInput model"
    # The trace of the call now running (an approved call runs later, in the trace of the call that asked).
    trace_id, span_id = tracing.ids()
    operation = engine.Operation(
        tenant_id=caller.tenant_id, tool=spec.name, key=args.idempotency_key, arguments=spec.business_arguments(args),
        fingerprint_version=spec.fingerprint_version,
        arguments_at=lambda version: spec.business_arguments(args, version),
        actor=caller.actor, trace_id=trace_id, span_id=span_id, retention=spec.retention_now(),
        on_expiry=spec.on_expiry,
        transactional=spec.transactional,
        approval=hooks.approval_gate(spec, caller.tenant_id, caller.actor, args) if spec.approval else None,
        retry_window=spec.retry_window, search_fields=spec.search_fields,
        admit=functools.partial(incidents.admit, caller.tenant_id, spec.name, spec.downstream),
        hold=entity_hold(caller.tenant_id, spec.concurrency_key_of(args)),
    )

    def execute(record: IdempotencyRecord) -> dict[str, Any]:
        context = ToolContext(tenant_id=caller.tenant_id, actor=caller.actor, trace_id=operation.trace_id,
                              span_id=operation.span_id, record=record, report_progress=caller.report_progress)
        result = (handler or spec.handler)(context, args)
        assert not isinstance(result, polling.Pending), "a write's handler answers its result; it never waits"
        return dump_result(spec, result)

    return operation, execute


def entity_hold(tenant_id: int, entity: str | None) -> Callable[[], AbstractContextManager[ToolFailure | None]] | None:
    """The engine's `hold` for a call on `entity` (a tool's concurrency_key): its slot, one at a time."""
    if entity is None:
        return None
    return functools.partial(incidents.one_at_a_time, incidents.entity_slot_name(tenant_id, entity),
                             wait=conf().concurrency_wait_seconds, what=entity)


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
