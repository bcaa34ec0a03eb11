"""IdempotentClient: tool calls that are safe to retry, remembered in a ledger.

    async with IdempotentClient(url, token, ledger=Ledger("calls.sqlite"), session_id="chat-42") as client:
        result = await client.call("create_order", {...})
        print(client.ledger.summary_for_model())

For a write tool (its input schema has `idempotency_key`) a call:

1. takes the caller's key, or derives one from (session, tool, canonical
   business arguments), so a re-planned identical call has the same key;
2. consults the ledger: an identical call already done in this session is
   answered from it without a round trip; anything else is (re)sent with the
   key the ledger holds;
3. for a tool the server marks as needing a server-issued operation id,
   asks `prepare_operation` for one first (when the server offers it) and
   carries it verbatim as the key;
4. records the call as `submitted` before sending, then every answer;
5. retries what is worth retrying (errors.RETRYABLE; unknown classes only
   with a retry_after) with the same key, within the RetryPolicy's budget.

Read tools are not recorded; they are retried on the same rules (a read
has no side effect).

The SDK's client runs one connection at a time, owned by a task of this
client: a failed connection (a dropped answer, a reset) fails the requests
in flight on it, and the next attempt opens a new one.
"""

from __future__ import annotations

import contextvars
import functools
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import httpx2
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client
from mcp.client.session import ElicitationFnT
from mcp_types import CallToolResult, ListToolsResult, RequestParamsMeta

from idemops_client.canonical import business_arguments, derive_key, fingerprint
from idemops_client.errors import DETERMINISTIC, ClientError, RetriesExhausted, ToolCallError, is_retryable
from idemops_client.extension import Advertisement, advertised_tools, declaration
from idemops_client.ledger import Entry, LedgerStore, MemoryLedger, SessionLedger, State
from idemops_client.retry import RetryPolicy
from idemops_client.tracing import OperationTrace
from idemops_client.transport import (
    Answer,
    Dialer,
    failed_attempt,
    http_seen,
    interpret,
    leaf,
    observe,
    result_text,
)

T = TypeVar("T")
# The operation (one call(), all its attempts) whose trace an attempt joins.
_operation: contextvars.ContextVar[OperationTrace | None] = contextvars.ContextVar("idemops_operation", default=None)

META_KEY = "io.idemops/idempotency-key"
REPLAYED_META = "io.idemops/replayed"
# What the server says about a tool in tools/list (see README: the server contract).
REQUIRES_OPERATION_ID_META = "io.idemops/requires-operation-id"
NON_BUSINESS_META = "io.idemops/non-business-fields"
PREPARE_TOOL = "prepare_operation"
GET_OPERATION_TOOL = "get_operation"

# The server's answer classes, as ledger states.
_STATE_OF_CLASS = {
    "in_progress": State.IN_PROGRESS,
    "unknown_outcome": State.UNKNOWN,
    "pending_approval": State.PENDING_APPROVAL,
}
# get_operation's status values, as ledger states and answer classes.
_OPERATION_STATUS = {
    "succeeded": (State.DONE, None),
    "failed": (State.FAILED, None),
    "processing": (State.IN_PROGRESS, "in_progress"),
    "unknown": (State.UNKNOWN, "unknown_outcome"),
    "awaiting_approval": (State.PENDING_APPROVAL, "pending_approval"),
}


def operation_status(value: object) -> str:
    """A status from a server's answer, lowercase: a server not yet upgraded answers records UPPERCASE."""
    return str(value).lower()

@dataclass(frozen=True)
class ToolInfo:
    name: str
    writes: bool
    requires_operation_id: bool = False
    non_business_fields: frozenset[str] = frozenset()


@dataclass
class CallResult:
    """A call's answer. `structured` is the server's structuredContent (with its `idempotency` block)."""

    tool: str
    structured: dict[str, Any]
    text: str = ""
    key: str | None = None
    operation_id: str | None = None
    replayed: bool = False  # the stored result of an earlier call with this key (the server's or the ledger's)
    from_ledger: bool = False  # answered from the ledger, without a round trip
    attempts: int = 0
    entry: Entry | None = None
    trace_id: str | None = None  # the W3C trace id every attempt carried (tracing.py)
    raw: CallToolResult | None = field(default=None, repr=False)

    def __getitem__(self, name: str) -> Any:
        return self.structured[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.structured.get(name, default)


class IdempotentClient:
    def __init__(self, url: str, token: str | None = None, *, ledger: LedgerStore | None = None,
                 session_id: str = "default", policy: RetryPolicy | None = None,
                 headers: Mapping[str, str] | None = None, rng: random.Random | None = None,
                 auth: httpx2.Auth | None = None, elicitation: ElicitationFnT | None = None):
        self.url = url
        # How this client's person answers a tool that asks them first (MCP elicitation: a confirmation
        # of a deletion or a payment); None: such a call answers `confirmation_required` with a link.
        self._elicitation = elicitation
        self._auth = auth  # in place of a token: e.g. the SDK's OAuthClientProvider (the proxy's --oauth)
        self.session_id = session_id
        self.store: LedgerStore = ledger if ledger is not None else MemoryLedger()
        self.policy = policy or RetryPolicy()
        self._rng = rng or random.Random()
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._http: httpx2.AsyncClient | None = None
        self._dialer: Dialer | None = None
        self._tools: dict[str, ToolInfo] | None = None
        self.advertisement: Advertisement | None = None  # the server's idempotency extension, once listed
        self._flights: dict[tuple[str, str], anyio.Lock] = {}

    @classmethod
    def sync(cls, url: str, token: str | None = None, **options: Any) -> SyncClient:
        """The same client for code that is not async: `with IdempotentClient.sync(url, token) as c: c.call(...)`."""
        return SyncClient(url, token, **options)

    @property
    def ledger(self) -> SessionLedger:
        """The ledger seen through this client's session."""
        return SessionLedger(self.store, self.session_id)

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> IdempotentClient:
        self._http = httpx2.AsyncClient(headers=self._headers, auth=self._auth, event_hooks={"response": [observe]},
                                        timeout=httpx2.Timeout(self.policy.attempt_timeout, connect=10))
        self._dialer = Dialer(self.url, self._http, self.policy.attempt_timeout, elicitation=self._elicitation)
        self.store.purge_expired()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        self._http = self._dialer = None

    async def _guarded(self, request: Callable[[Client], Awaitable[T]], timeout: float) -> T | Answer:
        """Run one request on a session of its own; a failure comes back as an Answer (never raised)."""
        if self._dialer is None:
            raise ClientError("use IdempotentClient in `async with`")
        seen: list[tuple[int, str | None]] = []
        token = http_seen.set(seen)
        reached = False
        try:
            with anyio.fail_after(timeout + 5):  # a guard: the SDK's own read timeout comes first
                async with self._dialer.session() as client:
                    reached = True
                    return await request(client)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # classified; cancellation is re-raised above
            return failed_attempt(leaf(exc), seen, reached=reached)
        finally:
            http_seen.reset(token)

    def _next_wait(self, what: str, key: str | None, answer: Answer, attempt: int, started: float,
                   policy: RetryPolicy) -> float:
        """How long to wait before the next attempt; raises if there is none."""
        assert answer.error_class is not None
        if not is_retryable(answer.error_class, answer.retry_after):
            raise ToolCallError(what, answer.error_class, answer.message, key=key, retry_after=answer.retry_after,
                                error=answer.error, attempts=attempt)
        wait = policy.delay(attempt, answer.retry_after, self._rng)
        elapsed = time.monotonic() - started
        if attempt >= policy.max_attempts or elapsed + wait >= policy.max_seconds:
            raise RetriesExhausted(what, answer.error_class, answer.message, key=key, retry_after=answer.retry_after,
                                   error=answer.error, attempts=attempt, elapsed=elapsed,
                                   reason="attempts" if attempt >= policy.max_attempts else "time")
        return wait

    @staticmethod
    def _timeout(policy: RetryPolicy, started: float) -> float:
        return max(1.0, min(policy.attempt_timeout, policy.max_seconds - (time.monotonic() - started)))

    # --- tools -------------------------------------------------------------------------------

    async def tools(self, refresh: bool = False) -> dict[str, ToolInfo]:
        """The server's tools as this client needs them (tools/list, read once)."""
        if self._tools is None or refresh:
            started, attempt = time.monotonic(), 0
            while True:
                attempt += 1
                listed = await self._guarded(advertised_tools, self._timeout(self.policy, started))
                if not isinstance(listed, Answer):
                    break
                await anyio.sleep(self._next_wait("tools/list", None, listed, attempt, started, self.policy))
            self.advertisement, listing = listed
            assert self._dialer is not None
            self._dialer.listing = listing
            self._tools = {tool.name: tool_info(tool, self.advertisement) for tool in listing.tools}
        return self._tools

    async def listing(self) -> ListToolsResult:
        """The server's tools/list, unchanged (every page as one listing), as the proxy offers it."""
        await self.tools()
        assert self._dialer is not None and self._dialer.listing is not None
        return self._dialer.listing

    async def _tool(self, name: str) -> ToolInfo:
        tools = await self.tools()
        if name not in tools:
            tools = await self.tools(refresh=True)
        if name not in tools:
            raise ToolCallError(name, "not_found", f"the server lists no tool {name!r}")
        return tools[name]

    # --- calls -------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *, key: str | None = None,
                   policy: RetryPolicy | None = None) -> CallResult:
        """Call `tool`; for a write, safely: see the module docstring.

        Raises ToolCallError for a final error (its `error_class` says which), and
        RetriesExhausted when the budget ran out (its `error_class` is the last answer's).
        """
        trace = OperationTrace(tool, {"idemops.session": self.session_id})
        scope = _operation.set(trace)
        try:
            result = await self._call(tool, dict(arguments or {}), key, policy or self.policy)
        except ToolCallError as error:
            error.trace_id = trace.trace_id
            trace.end(error.error_class)
            raise
        except BaseException:
            trace.end("error")
            raise
        finally:
            _operation.reset(scope)
        result.trace_id = trace.trace_id
        trace.end()
        return result

    async def _call(self, tool: str, arguments: dict[str, Any], key: str | None, policy: RetryPolicy) -> CallResult:
        info = await self._tool(tool)
        if not info.writes:
            return await self._read(tool, arguments, policy)
        given = arguments.pop("idempotency_key", None)
        if key is not None and given is not None and key != given:
            raise ValueError("idempotency_key in the arguments and key= differ")
        key = key if key is not None else given
        business = business_arguments(arguments, info.non_business_fields)
        call_id = key if key is not None else derive_key(self.session_id, tool, business)
        # One flight per operation in this process: a concurrent identical call waits, then reads the ledger.
        flight = self._flights.setdefault((tool, call_id), anyio.Lock())
        try:
            async with flight:
                return await self._call_write(info, arguments, key, call_id, business, policy)
        finally:
            if not flight.locked() and not flight.statistics().tasks_waiting:
                self._flights.pop((tool, call_id), None)

    async def _call_write(self, info: ToolInfo, arguments: dict[str, Any], key: str | None, call_id: str,
                          business: dict[str, Any], policy: RetryPolicy) -> CallResult:
        tool = info.name
        digest = fingerprint(business)
        entry = self.store.get(self.session_id, tool, call_id)
        if entry is None:
            wire_key = key
            if wire_key is None and info.requires_operation_id:
                wire_key = await self._prepare(tool, arguments, call_id, policy)
                if wire_key is None:
                    raise self._no_issuer(tool)  # before anything is sent or recorded
            # Recorded before it is sent: a crash from here on leaves an entry to ask about again.
            # (Another process may have added it first: then its entry is the one.)
            entry = self.store.add(self.store.new_entry(
                session_id=self.session_id, tool=tool, call_id=call_id, key=wire_key or call_id,
                fingerprint=digest, arguments=business))
        if entry.fingerprint != digest:
            # The caller's key is already this session's key for other arguments: the server
            # will say `conflict` (or, for declared non-business fields, replay). The entry
            # belongs to the first operation and is left as it is.
            detached = self.store.new_entry(session_id=self.session_id, tool=tool, call_id=call_id,
                                            key=entry.key, fingerprint=digest, arguments=business)
            return await self._write(tool, detached, arguments, policy, may_prepare=False, persist=False)
        if entry.state == State.DONE:
            return CallResult(tool=tool, structured=replayed_copy(entry.result or {}), key=entry.key,
                              operation_id=entry.operation_id, replayed=True, from_ledger=True, entry=entry)
        return await self._write(tool, entry, arguments, policy, may_prepare=key is None)

    async def _write(self, tool: str, entry: Entry, arguments: dict[str, Any], policy: RetryPolicy,
                     may_prepare: bool, persist: bool = True) -> CallResult:
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            answer = await self._attempt(tool, arguments, entry.key, self._timeout(policy, started))
            entry.attempts += 1
            if answer.error_class == "invalid_input" and (answer.error or {}).get("operation_id_required"):
                if may_prepare:
                    # The server refuses the key as not one it issued (unknown, expired unused,
                    # or the tool became high-risk): nothing ran under it, so a fresh id is safe. Once.
                    may_prepare = False
                    operation_id = await self._prepare(tool, arguments, entry.call_id, policy)
                    if operation_id is not None:
                        entry.key = operation_id
                        self.store.save(entry)
                        attempt -= 1
                        continue
                if self.prepare_tool not in await self.tools():
                    # Nothing can issue an id here: the caller is told so, and nothing is asked again.
                    self._record(entry, answer, persist)
                    raise self._no_issuer(tool, key=entry.key, error=answer.error, attempts=attempt)
            self._record(entry, answer, persist)
            if answer.ok:
                return self._result(tool, entry, answer, attempt)
            await anyio.sleep(self._next_wait(tool, entry.key, answer, attempt, started, policy))

    def _record(self, entry: Entry, answer: Answer, persist: bool = True) -> None:
        """The ledger entry after an answer (saved before anything else happens)."""
        operation_id = answer.idempotency.get("operation_id")
        if operation_id:
            entry.operation_id = str(operation_id)
        if answer.from_server:
            self.store.follow_server_expiry(entry, answer.idempotency)
        if answer.ok:
            entry.state = State.DONE
            entry.result = answer.structured
            entry.error = None
        elif answer.from_server:
            entry.error = answer.error
            if answer.error_class in _STATE_OF_CLASS:
                entry.state = _STATE_OF_CLASS[answer.error_class]
            elif answer.error_class in DETERMINISTIC:
                entry.state = State.FAILED
            # transient, rate_limited and the like: nothing was done; the state stands.
        else:
            entry.error = answer.error
            if answer.sent and entry.state == State.SUBMITTED:
                # No answer to a request that may have arrived: it may have happened.
                entry.state = State.UNKNOWN
        if persist:
            self.store.save(entry)

    def _result(self, tool: str, entry: Entry, answer: Answer, attempts: int) -> CallResult:
        assert answer.result is not None
        replayed_meta = self.advertisement.replayed_meta if self.advertisement else REPLAYED_META
        replayed = bool(answer.idempotency.get("replayed")) or bool((answer.result.meta or {}).get(replayed_meta))
        return CallResult(tool=tool, structured=answer.structured, text=result_text(answer.result), key=entry.key,
                          operation_id=entry.operation_id, replayed=replayed, attempts=attempts, entry=entry,
                          raw=answer.result)

    async def _read(self, tool: str, arguments: dict[str, Any], policy: RetryPolicy, key: str | None = None
                    ) -> CallResult:
        """A read (or prepare_operation) changes nothing the caller relies on: any retryable answer is asked again."""
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            answer = await self._attempt(tool, arguments, key, self._timeout(policy, started))
            if answer.ok:
                assert answer.result is not None
                return CallResult(tool=tool, structured=answer.structured, text=result_text(answer.result),
                                  attempts=attempt, raw=answer.result)
            await anyio.sleep(self._next_wait(tool, None, answer, attempt, started, policy))

    async def _attempt(self, tool: str, arguments: dict[str, Any], key: str | None, timeout: float) -> Answer:
        trace = _operation.get()
        if trace is None:  # a look-up outside call() (refresh): a trace of its own
            trace = OperationTrace(tool)
            trace.end()
        with trace.attempt() as trace_meta:
            key_meta = self.advertisement.key_meta if self.advertisement else META_KEY
            meta: dict[str, Any] = {**trace_meta, **({key_meta: key} if key is not None else {})}

            async def request(client: Client) -> Answer:
                return interpret(await client.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                                        meta=cast("RequestParamsMeta", meta)))

            answer = await self._guarded(request, timeout)
        return answer

    async def _prepare(self, tool: str, arguments: dict[str, Any], call_id: str, policy: RetryPolicy) -> str | None:
        """A server-issued operation id for a high-risk tool, if the server offers prepare_operation.

        Keyed by the call id: asked again (a retry, or a re-planned call after the
        ledger was lost), the server answers the same id.
        """
        prepare = self.prepare_tool
        if prepare not in await self.tools():
            return None
        prepared = await self._read(prepare, {"tool": tool, "arguments": arguments}, policy, key=call_id)
        operation_id = prepared.get("operation_id")
        if not isinstance(operation_id, str) or not operation_id:
            raise ToolCallError(prepare, "protocol_error", f"{prepare} answered no operation_id")
        return operation_id

    def _no_issuer(self, tool: str, *, key: str | None = None, error: dict[str, Any] | None = None,
                   attempts: int = 0) -> ToolCallError:
        """A high-risk tool on a server that issues no operation ids: said to the caller, not retried."""
        message = (f"{tool} takes only operation ids issued by the server, and {self.url} offers no "
                   f"{self.prepare_tool} tool to issue one: call it with an id the server gave you as its key")
        return ToolCallError(tool, "invalid_input", message, key=key, attempts=attempts,
                             error={**(error or {"class": "invalid_input", "operation_id_required": True}),
                                    "message": message})

    @property
    def prepare_tool(self) -> str:
        """The tool that issues operation ids: as the server advertises it (extension section 2), else the default."""
        return self.advertisement.prepare_operation_tool if self.advertisement else PREPARE_TOOL

    @property
    def get_operation_tool(self) -> str:
        """The tool that looks an operation up, as advertised, else the default."""
        return self.advertisement.get_operation_tool if self.advertisement else GET_OPERATION_TOOL

    # --- looking operations up ------------------------------------------------------------------

    async def refresh(self) -> list[Entry]:
        """Ask the server (get_operation) about this session's unfinished entries, and the finished ones
        held for a task the server said was unfinished (has it ended?), without re-sending them.

        Returns the entries it updated; an empty list if the server has no get_operation.
        """
        if self.get_operation_tool not in await self.tools():
            return []
        updated = []
        for entry in self.ledger.entries():
            if entry.state.finished and not entry.held:
                continue
            lookup = ({"operation_id": entry.operation_id} if entry.operation_id
                      else {"tool": entry.tool, "idempotency_key": entry.key})
            try:
                found = await self._read(self.get_operation_tool, lookup, self.policy)
            except ToolCallError as error:
                if error.error_class == "not_found":
                    continue  # never arrived (or long expired): the entry stands
                raise
            if entry.state.finished:
                # start_task's own answer (the task handle) stands; only whether its task ended is news.
                self.store.follow_server_expiry(entry, found.structured)
                self.store.save(entry)
                updated.append(entry)
                continue
            self.store.follow_server_expiry(entry, found.structured)
            if _take_operation(entry, found):
                self.store.save(entry)
                updated.append(entry)
        return updated


def _take_operation(entry: Entry, found: CallResult) -> bool:
    """Update an unfinished `entry` from get_operation's answer about it; False if the status says nothing new."""
    state, _ = _OPERATION_STATUS.get(operation_status(found.get("status")), (None, None))
    found_error = found.get("error") if isinstance(found.get("error"), dict) else None
    if state == State.FAILED and found_error and is_retryable(str(found_error.get("class")),
                                                                  found_error.get("retry_after")):
        # Failed in a way that did nothing (transient): the same key may run it again.
        state = State.SUBMITTED
    if state is None:
        return False
    entry.state = state
    entry.operation_id = found.get("operation_id") or entry.operation_id
    if state == State.DONE:
        entry.result, entry.error = found.get("result"), None
    elif found.get("error"):
        entry.error = found.get("error")
    return True


# --- reading answers -------------------------------------------------------------------------------


def replayed_copy(structured: dict[str, Any]) -> dict[str, Any]:
    """A recorded first answer, given again: its `idempotency.replayed` says so, as the server's own replay
    does (the first answer said false, and a ledger answer marked replayed in `_meta` must not contradict it)."""
    answer = dict(structured)
    if isinstance(answer.get("idempotency"), dict):
        answer["idempotency"] = {**answer["idempotency"], "replayed": True}
    return answer


def tool_info(tool: Any, advertisement: Advertisement | None = None) -> ToolInfo:
    """What the client must do with the tool: the extension's declaration (docs/extension/idempotency.md
    section 3) from a server that advertises it; guessed from `_meta` and the input schema otherwise."""
    if advertisement is not None:
        declared = declaration(tool)
        if declared is None:
            return ToolInfo(name=tool.name, writes=False)
        return ToolInfo(name=tool.name, writes=declared.key_required,
                        requires_operation_id=declared.requires_operation_id,
                        non_business_fields=declared.non_business_fields)
    meta = tool.meta or {}
    properties = (tool.input_schema or {}).get("properties") or {}
    read_only = tool.annotations.read_only_hint if tool.annotations is not None else None
    # A tool that says it is read-only is a read even with an idempotency_key argument (get_operation
    # looks an operation up by its key); without the hint, that argument marks a write.
    writes = read_only is False or (read_only is None and "idempotency_key" in properties)
    return ToolInfo(name=tool.name, writes=writes, requires_operation_id=bool(meta.get(REQUIRES_OPERATION_ID_META)),
                    non_business_fields=frozenset(meta.get(NON_BUSINESS_META) or ()))


class SyncClient:
    """IdempotentClient's API without `await` (`IdempotentClient.sync(...)` makes one)."""

    def __init__(self, url: str, token: str | None = None, **options: Any):
        self.client = IdempotentClient(url, token, **options)
        self._portal: BlockingPortal | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None

    def __enter__(self) -> SyncClient:
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self._portal.call(self.client.__aenter__)
        except BaseException as exc:
            self._portal_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        assert self._portal is not None and self._portal_cm is not None
        try:
            self._portal.call(self.client.__aexit__, None, None, None)
        finally:
            self._portal_cm.__exit__(*exc_info)
            self._portal = self._portal_cm = None

    def _run(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            raise ClientError("use SyncClient in `with`")
        return self._portal.call(functools.partial(function, *args, **kwargs))

    @property
    def ledger(self) -> SessionLedger:
        return self.client.ledger

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *, key: str | None = None,
             policy: RetryPolicy | None = None) -> CallResult:
        result: CallResult = self._run(self.client.call, tool, arguments, key=key, policy=policy)
        return result

    def tools(self, refresh: bool = False) -> dict[str, ToolInfo]:
        tools: dict[str, ToolInfo] = self._run(self.client.tools, refresh)
        return tools

    def refresh(self) -> list[Entry]:
        entries: list[Entry] = self._run(self.client.refresh)
        return entries
