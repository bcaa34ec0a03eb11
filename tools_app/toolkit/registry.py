"""The tool registry: each tool is declared once, in tools_app/tools/ or in an app's `idemops_tools` module.

A declaration names the tool, its pydantic input and output models (built on
StrictModel: strict types, no unknown fields at any level), whether it writes,
which arguments are not business data (left out of the fingerprint), which are
personal (never logged: `personal_fields`, required of every tool), whether its
key must be an operation id the server issued (high-risk tools), how long
its idempotency records are kept and what happens to a key past that, the
checks its arguments must pass before a key is claimed, and the handler. Everything else (the MCP schema, the
annotations, the engine's policy) is derived from it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
import warnings
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Generic

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import TypeVar

from tools_app.access.models import Tenant
from tools_app.core import redaction
from tools_app.core.errors import NotFound
from tools_app.core.keys import FINGERPRINT_AS_SENT, FINGERPRINT_FILLED, KEY_RULE
from tools_app.core.polling import Pending
from tools_app.engine import DEFAULT_RETENTION, ExpiryPolicy
from tools_app.engine.models import IdempotencyRecord
from tools_app.toolkit.policies import (
    KEEP_DEFAULTS,
    ApprovalPolicy,
    ConfirmationPolicy,
    Found,
    KeepFor,
    NotDone,
    StillUnknown,
)

# Arguments every write tool takes that are not part of the operation.
ENGINE_FIELDS = frozenset({"idempotency_key", "trace_id"})


BIGINT_MAX = 2**63 - 1
# An id of a row (every primary key is a bigint).
ObjectId = Annotated[int, Field(gt=0, le=BIGINT_MAX)]


def storable(text: str) -> bool:
    """False for what PostgreSQL cannot store in text or jsonb: NUL, and unpaired surrogates (not UTF-8).

    Plain `in` and encode rather than a regex: inline documents run to megabytes.
    """
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unstorable_at(value: Any) -> str | None:
    """Where inside `value` a string PostgreSQL cannot store is ("" for `value` itself), or None.

    Nested models are skipped: they are StrictModels and checked themselves.
    """
    if isinstance(value, str):
        return None if storable(value) else ""
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, (list, tuple)) else ())
    for key, item in items:
        if isinstance(key, str) and not storable(key):
            return f"key {key!r}"
        inner = unstorable_at(item)
        if inner is not None:
            return f"{key}.{inner}" if inner else str(key)
    return None


class StrictModel(BaseModel):
    """Base of every model a tool's arguments are read into, nested ones included.

    Arguments are validated as the JSON they arrived as (see `parse_arguments`),
    in strict mode: an integer field takes 3, not "3", 3.0 or true; a decimal
    field takes "2.50" or 2.5. Unknown fields are an error at every level, and
    no string may hold a character PostgreSQL cannot store, so a bad argument
    is `invalid_input` naming its field, before a key is claimed, instead of a
    database error later.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        where = unstorable_at(value)
        if where is not None:
            at = f" at {where}" if where else ""
            raise ValueError(f"contains a character that cannot be stored{at} (NUL, U+0000, or an unpaired "
                             "surrogate)")
        return value


def parse_arguments(model: type[BaseModel], arguments: Any) -> BaseModel:
    """Validate `arguments` (JSON-compatible data) as the JSON they stand for.

    Strict JSON mode is the contract agents see in the schema: "2.50" is a
    decimal and "normal" an enum value, but "3" is not an integer. In-process
    callers may pass Decimals and the like: they are written as JSON first.
    """
    return model.model_validate_json(pydantic_core.to_json(arguments))


class ToolInput(StrictModel):
    """Base of every tool's input model."""

    model_config = ConfigDict(str_strip_whitespace=True)

    trace_id: str | None = Field(None, max_length=100, description=(
        "Optional: your own id for this call, echoed in idemops' logs as client_trace_id. The trace idemops "
        "records is the W3C trace context of the call (params._meta.traceparent, or the HTTP traceparent "
        "header); without one, a new trace is started."))


class WriteInput(ToolInput):
    idempotency_key: str = Field(
        description=f"Required for writes. The identity of this business operation: reuse it on every retry "
                    f"of the same operation, use a new one for a new operation. {KEY_RULE}. May instead be sent "
                    f"in the call's _meta as io.idemops/idempotency-key.",
        min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._:-]+$",
    )


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


@dataclass(frozen=True)
class ToolContext:
    """What a handler knows about the call besides its arguments."""

    tenant_id: int
    actor: str
    trace_id: str = ""  # the call's W3C trace id (tools_app.core.tracing)
    span_id: str = ""  # the call's span, under which later work (a task's steps, a delivery) is traced
    # The IdempotencyRecord of a write call (None for a read). Kept `Any` for now: handlers pass it on
    # unchecked (tools_app.tools, the demo); typing it optional means narrowing it at each of them.
    record: Any = None
    # Sends an MCP progress notification if the caller asked for them
    # (a progressToken); a no-op otherwise. Callable from the handler's thread.
    report_progress: Callable[[float, float | None, str | None], None] = _no_progress

    @property
    def downstream_key(self) -> str:
        """The key a write sends to the system that acts (its Idempotency-Key): stable across every retry
        of this operation, and what a reconciler asks that system about (`SentCall.downstream_key`)."""
        key: str = self.record.downstream_key
        return key

    @property
    def operation_id(self) -> str:
        """This operation's id (as text): in the agent's answer, the audit log and the console; send it
        along (e.g. X-Operation-Id) so the other system's records name the same operation."""
        return str(self.record.operation_id)


# A read that waits (the task tools' wait_seconds) may answer a handle on its wait (core.polling).
Handler = Callable[[ToolContext, Any], "dict[str, Any] | BaseModel | Pending[Any]"]
# Decides whether a call needs a person's approval: (tenant, validated arguments)
# -> an ApprovalPolicy (summary, approvers needed, amount) or None to run at once.
ApprovalRule = Callable[[Tenant, Any], ApprovalPolicy | None]
# Decides whether the person behind the agent confirms a call first: (tenant, validated arguments)
# -> a ConfirmationPolicy (the summary they are shown) or None to run without asking.
ConfirmationRule = Callable[[Tenant, Any], ConfirmationPolicy | None]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input_model: type[ToolInput]
    output_model: type[BaseModel]
    handler: Handler
    writes: bool
    # Arguments that hold personal data (a customer, an address, a payee, a document's text): their
    # values never appear in a log line (core.redaction). Every tool declares them, if only as empty.
    personal_fields: frozenset[str] | None = None
    # Arguments that do not change what the operation is (a client's timestamp, a note for the
    # model's own use): left out of the fingerprint, so changing them is a replay, not a conflict.
    # Advertised in tools/list `_meta` (io.idemops/non-business-fields) for clients deriving keys.
    non_business_fields: frozenset[str] = frozenset()
    # How long a record is kept; a callable is asked at each call (a retention that is a setting).
    retention: timedelta | Callable[[], timedelta] = DEFAULT_RETENTION
    on_expiry: ExpiryPolicy = ExpiryPolicy.REEXECUTE
    # How long what its calls leave behind is kept once finished (tools_app.retention purges the rest).
    keep: KeepFor = KeepFor()
    destructive: bool = False
    open_world: bool = False
    # False for tools whose effect happens in another system: the engine then
    # holds no transaction across the call, sends `downstream_key` along, and
    # an interrupted call ends UNKNOWN until `reconciler` finds out.
    transactional: bool = True
    # (SentCall) -> reconciliation.Found | NotDone | StillUnknown. Transactional
    # tools need none: if their record never committed, neither did the effect.
    reconciler: Callable[[Any], Any] | None = None
    # (SentCall, downstream reference) -> the result to store when an operator
    # resolves an UNKNOWN record as succeeded.
    result_for_reference: Callable[[Any, str], dict[str, Any]] | None = None
    approval: ApprovalRule | None = None  # set: a sensitive tool (see tools_app.approvals)
    # Checks beyond the input model (allow-lists, what another tool accepts), given the
    # validated arguments; they run before a write claims its key, so a refused call
    # leaves the key unused. Raise a ToolFailure naming the field.
    check: Callable[[Any], None] | None = None
    # Set for long tools (tools_app.toolkit.pipelines.task_tool): a call starts or rejoins a task running it.
    pipeline: Any = None
    # A high-risk write: its key must be an operation id issued by prepare_operation (engine.prepared),
    # never one the model made up. Advertised in tools/list `_meta` (io.idemops/requires-operation-id).
    requires_operation_id: bool = False
    # Defaults that decide what the operation is (a currency): filled into the fingerprint when the
    # caller leaves the field out, so sending the default and leaving it out are one operation. Each
    # set is fixed once deployed: a change appends a new set (fingerprint version 3, 4, ...), and keys
    # claimed under an earlier set are compared under it. Any other default is left out of the
    # fingerprint (version 2): a deploy adding an optional argument changes nothing for live keys.
    counted_defaults: tuple[dict[str, Any], ...] = ()
    # What the fingerprint covers, when it is not simply the arguments sent without the excluded
    # fields: (validated arguments, fingerprint version) -> business arguments.
    operation_arguments: Callable[[Any, int], dict[str, Any]] | None = None
    # The downstream system its effect reaches (a name: "payment-gateway"): its circuit breaker, its
    # pauses and its limit on calls in flight apply to the tool before it runs (tools_app.incidents).
    # Unset, a tool calling downstream_request is known by the URL's host once it has called.
    downstream: str | None = None
    # How long a key whose runs the downstream refused before acting (a known non-execution: 503 or
    # 429 "nothing done", connection refused, a Transient raised before sending) may be run again;
    # past it the record is FAILED for good (`not_executed`). None: IDEMOPS_RETRY_WINDOW_SECONDS.
    retry_window: timedelta | None = None
    # Non-personal argument or result fields operators and auditors search by (an order reference, a
    # ticket number): stored indexed with the record (engine: IdempotencyRecord.attributes).
    search_fields: frozenset[str] = frozenset()
    # The business entity a call acts on, from its arguments (an account, an order): two calls with
    # the same key never run at once, in any process; a third waits IDEMOPS_CONCURRENCY_WAIT_SECONDS,
    # then answers in_progress. A field name (the key is `name=value`, shared by every tool keyed by
    # that field) or a callable (validated arguments) -> str. Unset: no such limit.
    concurrency_key: str | Callable[[Any], str] | None = None
    # Set: the person behind the agent confirms a call through their MCP host before it runs
    # (elicitation; tools_app.approvals.confirmations). `always_confirm`, or a rule of the tenant and
    # the arguments (above an amount, ...) returning a ConfirmationPolicy or None (never).
    confirmation: ConfirmationRule | None = None

    def concurrency_key_of(self, args: BaseModel) -> str | None:
        """The business entity `args` act on (concurrency_key), or None."""
        if self.concurrency_key is None:
            return None
        if callable(self.concurrency_key):
            return str(self.concurrency_key(args))
        return f"{self.concurrency_key}={getattr(args, self.concurrency_key)}"

    @property
    def excluded_from_fingerprint(self) -> frozenset[str]:
        return ENGINE_FIELDS | self.non_business_fields

    @property
    def fingerprint_version(self) -> int:
        """The version new calls are fingerprinted under (core.keys)."""
        return FINGERPRINT_AS_SENT + len(self.counted_defaults)

    def business_arguments(self, args: BaseModel, version: int | None = None) -> dict[str, Any]:
        """The arguments that make the operation what it is: what its fingerprint (of `version`, by
        default the current one) covers."""
        version = self.fingerprint_version if version is None else version
        if self.operation_arguments is not None:
            return self.operation_arguments(args, version)
        return self.sent_arguments(args, version)

    def sent_arguments(self, args: BaseModel, version: int) -> dict[str, Any]:
        """The validated arguments without the excluded fields, as fingerprint `version` covers them."""
        excluded = set(self.excluded_from_fingerprint)
        if version == FINGERPRINT_FILLED:
            return args.model_dump(mode="python", exclude=excluded)
        # Only what the caller sent (at every level): a default is the server's word, and may change.
        sent = args.model_dump(mode="python", exclude=excluded, exclude_unset=True)
        counted = version - FINGERPRINT_AS_SENT
        if 0 < counted <= len(self.counted_defaults):
            return {**self.counted_defaults[counted - 1], **sent}
        return sent

    def retention_now(self) -> timedelta:
        return self.retention() if callable(self.retention) else self.retention


_TOOLS: dict[str, ToolSpec] = {}


def register(spec: ToolSpec) -> ToolSpec:
    """Add a declared tool; a declaration that breaks a rule is refused naming the module it came from."""
    try:
        _check(spec)
    except (TypeError, ValueError) as refused:
        raise type(refused)(f"{refused} (declared in {_module_of(spec)})") from None
    redaction.declare_personal(spec.personal_fields or frozenset())
    _TOOLS[spec.name] = spec
    return spec


def _module_of(spec: ToolSpec) -> str:
    handler_module = getattr(spec.handler, "__module__", "")
    # A long tool's handler is the platform's; its input model was written beside its declaration.
    if spec.pipeline is not None or handler_module == __name__:
        return spec.input_model.__module__
    return handler_module


def _check(spec: ToolSpec) -> None:
    if spec.name in _TOOLS:
        raise ValueError(f"tool {spec.name!r} is declared twice (first in {_module_of(_TOOLS[spec.name])})")
    if spec.writes and not issubclass(spec.input_model, WriteInput):
        raise TypeError(f"write tool {spec.name!r} must take a WriteInput model")
    if not spec.transactional and spec.reconciler is None:
        raise TypeError(f"tool {spec.name!r} acts downstream and must declare a reconciler")
    if spec.personal_fields is None:
        raise TypeError(f"tool {spec.name!r} must declare its personal_fields (frozenset() if it takes none)")
    unknown: AbstractSet[str] = spec.personal_fields - spec.input_model.model_fields.keys()
    if unknown:
        raise TypeError(f"tool {spec.name!r} declares personal fields it does not take: {sorted(unknown)}")
    _check_options(spec)


def _check_options(spec: ToolSpec) -> None:
    """The rest of _check: the declaration's options agree with the tool's kind and its fields."""
    unknown: AbstractSet[str]
    if spec.requires_operation_id and (not spec.writes or spec.pipeline is not None):
        raise TypeError(f"tool {spec.name!r}: only a short write tool can require an issued operation id")
    if unknown := spec.non_business_fields - spec.input_model.model_fields.keys():
        raise TypeError(f"tool {spec.name!r} declares non-business fields it does not take: {sorted(unknown)}")
    if unknown := spec.search_fields & (spec.personal_fields or frozenset()):
        raise TypeError(f"tool {spec.name!r}: search fields must not be personal: {sorted(unknown)}")
    if unknown := spec.search_fields - spec.input_model.model_fields.keys() - spec.output_model.model_fields.keys():
        raise TypeError(f"tool {spec.name!r} declares search fields that are neither arguments nor result fields: "
                        f"{sorted(unknown)}")
    _check_concurrency_key(spec)
    if spec.confirmation is not None and (not spec.writes or spec.pipeline is not None):
        raise TypeError(f"tool {spec.name!r}: only a short write tool can ask for its user's confirmation")
    if spec.retry_window is not None and spec.retry_window <= timedelta(0):
        raise ValueError(f"tool {spec.name!r}: retry_window must be positive")
    counted = {name for defaults in spec.counted_defaults for name in defaults}
    if unknown := counted - spec.input_model.model_fields.keys():
        raise TypeError(f"tool {spec.name!r} declares counted defaults for fields it does not take: {sorted(unknown)}")


def _check_concurrency_key(spec: ToolSpec) -> None:
    key = spec.concurrency_key
    if key is not None and (not spec.writes or spec.pipeline is not None):
        raise TypeError(f"tool {spec.name!r}: only a short write tool can declare a concurrency_key")
    if isinstance(key, str) and key not in spec.input_model.model_fields:
        raise TypeError(f"tool {spec.name!r}: concurrency_key {key!r} is not one of its arguments")
    if isinstance(key, str) and key in (spec.personal_fields or frozenset()):
        raise TypeError(f"tool {spec.name!r}: concurrency_key must not be a personal field")


# The model a tool's arguments are read into, inferred from its handler's `args` annotation: the
# handler and the rules that read the same arguments (approval, confirmation, check, concurrency_key,
# operation_arguments) are typed over it, so mypy finds one that reads another model.
InputT = TypeVar("InputT", bound=ToolInput, default=Any)
WriteInputT = TypeVar("WriteInputT", bound=WriteInput, default=Any)
OutputT = TypeVar("OutputT")


@dataclass(frozen=True)
class Retention:
    """How long a write's key holds (`key`: a duration, or a callable asked at each call), what a key past
    it does (`on_expiry`), and how long what its calls leave behind is kept once finished (`keep`)."""

    key: timedelta | Callable[[], timedelta] = DEFAULT_RETENTION
    on_expiry: ExpiryPolicy = ExpiryPolicy.REEXECUTE
    keep: KeepFor = KEEP_DEFAULTS


class SentCall(Generic[WriteInputT]):
    """What a reconciler (and `result_for_reference`) knows of a call whose outcome is unknown: `args`, the
    call's validated input (the tool's input model, rebuilt from the arguments its record keeps, decrypted);
    `downstream_key`, the key the other system was sent; `key`, the caller's idempotency key;
    `operation_id`; `tenant`; and `record`, the idempotency record itself, for whoever needs more.

    Until API_VERSION 2.1 a reconciler was given the record: the record's other attributes still read
    through a SentCall (deprecated), so such a reconciler keeps working."""

    def __init__(self, record: IdempotencyRecord, input_model: type[WriteInputT]) -> None:
        self.record = record
        self._input_model = input_model

    @property
    def downstream_key(self) -> str:
        return self.record.downstream_key

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def operation_id(self) -> str:
        return str(self.record.operation_id)

    @property
    def tenant_id(self) -> int:
        return self.record.tenant_id

    @property
    def tenant(self) -> Tenant:
        return self.record.tenant

    @functools.cached_property
    def args(self) -> WriteInputT:
        """The call's input, as its handler was given it. A record keeps the business arguments: a tool whose
        `operation_arguments` reshape them, or with a required non-business field, cannot rebuild its input
        (ValueError: a reconciler reads `record.arguments` then)."""
        try:
            args = parse_arguments(self._input_model, {**self.record.arguments, "idempotency_key": self.record.key})
        except pydantic_core.ValidationError as exc:
            raise ValueError(f"the arguments kept with record {self.record.pk} do not rebuild "
                             f"{self._input_model.__name__}: {exc.error_count()} error(s)") from None
        return typing.cast(WriteInputT, args)

    if not TYPE_CHECKING:  # the record's other attributes, for reconcilers written before 2.1 (deprecated)
        def __getattr__(self, name: str) -> Any:
            if name.startswith("_") or name == "record":
                raise AttributeError(name)
            return getattr(self.record, name)

    def __repr__(self) -> str:
        return f"SentCall(record={self.record.pk}, key={self.key!r})"


def sent_call(record: IdempotencyRecord, spec: ToolSpec) -> SentCall[Any]:
    """What the tool's reconciler is given for `record`."""
    return SentCall(record, spec.input_model)


@dataclass(frozen=True)
class Reconciliation(Generic[WriteInputT]):
    """A write whose effect happens in another system (not transactional): `reconciler` (SentCall) ->
    Found | NotDone | StillUnknown finds out what became of an interrupted call; `result_for_reference`
    (SentCall, downstream reference) -> the result stored when an operator resolves one as succeeded;
    `retry_window`: how long a key the downstream refused before acting may run again (None: the setting).
    Both callables read the SentCall of the tool's own input model (`SentCall[RefundInput]`): mypy holds
    them to the handler's."""

    reconciler: Callable[[SentCall[WriteInputT]], Found | NotDone | StillUnknown]
    result_for_reference: Callable[[SentCall[WriteInputT], str], dict[str, Any]] | None = None
    retry_window: timedelta | None = None


def _takes_record(function: Callable[..., Any] | None) -> bool:
    """Whether `function`'s first parameter is annotated with anything but a SentCall (a reconciler
    written for the record, before API_VERSION 2.1). Unannotated, or unresolvable: assumed new."""
    if function is None:
        return False
    try:
        hints = typing.get_type_hints(function)
        parameters = list(inspect.signature(function).parameters)
    except Exception:  # an annotation only a type checker resolves, or no signature: nothing to say
        return False
    hint = hints.get(parameters[0]) if parameters else None
    return hint is not None and hint is not Any and (typing.get_origin(hint) or hint) is not SentCall


def _deprecated(tool: str, old: str, new: str, since: str = "1.2", stacklevel: int = 4) -> None:
    warnings.warn(f"tool {tool!r}: {old} is deprecated (API_VERSION {since}); {new}", DeprecationWarning,
                  stacklevel=stacklevel)


def grouped_retention(name: str, retention: Retention | timedelta | Callable[[], timedelta] | None,
                      on_expiry: ExpiryPolicy | None, keep: KeepFor | None, *, stacklevel: int = 5) -> Retention:
    """A declaration's `retention`, as a Retention: the old flat keywords (a duration, `on_expiry=`, `keep=`)
    still work, with a DeprecationWarning (`stacklevel`: the declaring line's, seen from here)."""
    flat = on_expiry is not None or keep is not None
    if isinstance(retention, Retention):
        if flat:
            raise TypeError(f"tool {name!r}: on_expiry and keep belong in its Retention")
        return retention
    if retention is not None or flat:
        _deprecated(name, "retention=<duration>, on_expiry= and keep=",
                    "say retention=Retention(key=, on_expiry=, keep=)", stacklevel=stacklevel)
    default = Retention()
    return Retention(key=default.key if retention is None else retention,
                     on_expiry=default.on_expiry if on_expiry is None else on_expiry,
                     keep=default.keep if keep is None else keep)


def _annotated_models(handler: Callable[..., Any], scope: dict[str, Any],
                      ) -> tuple[type[BaseModel] | None, type[BaseModel] | None]:
    """The input model of `handler(ctx, args)` (its `args` annotation) and its output model (its return
    annotation, or the model in `Model | Pending[Model]`), or None where they are not pydantic models.
    `scope`: the names where the handler was declared (a model declared inside a function)."""
    try:
        hints = typing.get_type_hints(handler, localns=scope)
    except Exception:  # an annotation only a type checker can resolve: the declaration must name its models
        return None, None
    parameters = list(inspect.signature(handler).parameters)
    hint = hints.get(parameters[1]) if len(parameters) > 1 else None
    model_in = hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None
    returned = hints.get("return")
    candidates = typing.get_args(returned) if typing.get_args(returned) and not isinstance(returned, type) \
        else (returned,)
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return model_in, models[0] if len(models) == 1 else None


def _models(name: str, handler: Callable[..., Any], declaration: dict[str, Any], scope: dict[str, Any]) -> None:
    """Fill the declaration's input and output models from the handler's annotations; a model also named
    in the old keywords is deprecated, and one that differs from the annotation is refused."""
    inferred = dict(zip(("input_model", "output_model"), _annotated_models(handler, scope), strict=True))
    for keyword, model in inferred.items():
        given = declaration.get(keyword)
        if given is not None:
            _deprecated(name, f"{keyword}=", "the model is read from the handler's annotations")
            if model is not None and given is not model:
                raise TypeError(f"tool {name!r}: {keyword}={given.__name__} differs from the handler's "
                                f"annotation {model.__name__} (declared in {handler.__module__})")
        elif model is None:
            raise TypeError(f"tool {name!r}: annotate the handler's "
                            f"{'args parameter' if keyword == 'input_model' else 'return'} with a pydantic model "
                            f"(declared in {handler.__module__})")
        else:
            declaration[keyword] = model


def _policies(name: str, declaration: dict[str, Any]) -> None:
    """The grouped policies (Retention, Reconciliation) into ToolSpec's fields; the old flat keywords
    still work, with a DeprecationWarning."""
    retention = grouped_retention(name, declaration.pop("retention"), declaration.pop("on_expiry"),
                                  declaration.pop("keep"))
    declaration.update(retention=retention.key, on_expiry=retention.on_expiry, keep=retention.keep)
    reconciliation = declaration.pop("reconciliation")
    flat = {k: declaration.pop(k) for k in ("transactional", "reconciler", "result_for_reference", "retry_window")}
    callables = ((reconciliation.reconciler, reconciliation.result_for_reference) if reconciliation is not None
                 else (flat["reconciler"], flat["result_for_reference"]))
    if any(_takes_record(function) for function in callables):
        _deprecated(name, "a reconciler (or result_for_reference) given the idempotency record",
                    "take a SentCall[YourInput] (call.args, call.downstream_key, call.record)", since="2.1")
    if reconciliation is not None:
        if any(v is not None for v in flat.values()):
            raise TypeError(f"tool {name!r}: transactional, reconciler, result_for_reference and retry_window "
                            "belong in its Reconciliation")
        declaration.update(transactional=False, reconciler=reconciliation.reconciler,
                           result_for_reference=reconciliation.result_for_reference,
                           retry_window=reconciliation.retry_window)
        return
    if any(v is not None for v in flat.values()):
        _deprecated(name, "transactional=, reconciler=, result_for_reference= and retry_window=",
                    "say reconciliation=Reconciliation(reconciler, result_for_reference=, retry_window=)")
    declaration.update(transactional=True if flat["transactional"] is None else flat["transactional"],
                       **{k: flat[k] for k in ("reconciler", "result_for_reference", "retry_window")})


def _declare(writes: bool, **declaration: Any) -> Callable[[Callable[..., Any]], Any]:
    def decorator(handler: Callable[..., Any]) -> Any:
        _models(declaration["name"], handler, declaration, dict(sys._getframe(1).f_locals))
        if writes:
            _policies(declaration["name"], declaration)
        description = declaration.pop("description", None) or (handler.__doc__ or "").strip()
        register(ToolSpec(handler=handler, writes=writes, description=description, **declaration))
        return handler

    return decorator


def write_tool(*, name: str, title: str, personal_fields: frozenset[str], description: str | None = None,
               non_business_fields: frozenset[str] = frozenset(),
               retention: Retention | timedelta | Callable[[], timedelta] | None = None,
               destructive: bool = False, open_world: bool = False,
               reconciliation: Reconciliation[WriteInputT] | None = None,
               approval: Callable[[Tenant, WriteInputT], ApprovalPolicy | None] | None = None,
               confirmation: Callable[[Tenant, WriteInputT], ConfirmationPolicy | None] | None = None,
               check: Callable[[WriteInputT], None] | None = None,
               requires_operation_id: bool = False,
               operation_arguments: Callable[[WriteInputT, int], dict[str, Any]] | None = None,
               counted_defaults: tuple[dict[str, Any], ...] = (),
               downstream: str | None = None,
               search_fields: frozenset[str] = frozenset(),
               concurrency_key: str | Callable[[WriteInputT], str] | None = None,
               # Deprecated (API_VERSION 1.2): read from the handler's annotations, or grouped above.
               input_model: type[WriteInputT] | None = None, output_model: type[BaseModel] | None = None,
               on_expiry: ExpiryPolicy | None = None, keep: KeepFor | None = None,
               transactional: bool | None = None, reconciler: Callable[[Any], Any] | None = None,
               result_for_reference: Callable[[Any, str], dict[str, Any]] | None = None,
               retry_window: timedelta | None = None,
               ) -> Callable[[Callable[[ToolContext, WriteInputT], OutputT]],
                             Callable[[ToolContext, WriteInputT], OutputT]]:
    """Declare a tool with side effects on its handler `(ctx: ToolContext, args: SomeWriteInput) -> SomeOutput`:
    it runs under the idempotency engine (see ToolSpec for what each part means). The input and output models
    are the handler's annotations; `approval`, `confirmation`, `check`, `concurrency_key` and
    `operation_arguments` read the same input model (mypy holds them to it). The description defaults to the
    handler's docstring. A `reconciliation`'s callables read a SentCall of the same input model."""
    return _declare(True, name=name, title=title, input_model=input_model, output_model=output_model,
                    personal_fields=personal_fields, description=description,
                    non_business_fields=non_business_fields, retention=retention, on_expiry=on_expiry, keep=keep,
                    destructive=destructive, open_world=open_world, transactional=transactional,
                    reconciliation=reconciliation,
                    reconciler=reconciler, result_for_reference=result_for_reference, approval=approval,
                    check=check, requires_operation_id=requires_operation_id,
                    operation_arguments=operation_arguments, counted_defaults=counted_defaults,
                    downstream=downstream, retry_window=retry_window, search_fields=search_fields,
                    concurrency_key=concurrency_key, confirmation=confirmation)


def read_tool(*, name: str, title: str, personal_fields: frozenset[str], description: str | None = None,
              open_world: bool = False, check: Callable[[InputT], None] | None = None,
              # Deprecated (API_VERSION 1.2): read from the handler's annotations.
              input_model: type[InputT] | None = None, output_model: type[BaseModel] | None = None,
              ) -> Callable[[Callable[[ToolContext, InputT], OutputT]], Callable[[ToolContext, InputT], OutputT]]:
    """Declare a tool that only reads: no key, no record; called as often as the agent likes. Its input and
    output models are its handler's annotations."""
    return _declare(False, name=name, title=title, input_model=input_model, output_model=output_model,
                    personal_fields=personal_fields, description=description, open_world=open_world,
                    check=check)


def get_tool(name: str) -> ToolSpec:
    try:
        return _TOOLS[name]
    except KeyError:
        raise NotFound(f"unknown tool {name!r}; tools/list names the tools") from None


def find_tool(name: str) -> ToolSpec | None:
    return _TOOLS.get(name)


def all_tools() -> list[ToolSpec]:
    return list(_TOOLS.values())
