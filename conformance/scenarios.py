"""The scenarios: each checks one requirement of docs/extension/idempotency.md against a live server.

A scenario returns a Check (pass, fail or skip) saying what it saw; an assertion that fails is a
`fail` whose message is what it saw instead. Section numbers are the specification's.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.wire import EXTENSION, MODERN, Connection, WireError


@dataclass
class Options:
    url: str
    token: str | None
    version: str
    tool: str = "create_order"
    arguments: dict[str, Any] = field(default_factory=lambda: {
        "customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]})
    conflict_arguments: dict[str, Any] | None = None
    storm: int = 8
    slow_tool: str | None = None
    slow_arguments: dict[str, Any] = field(default_factory=dict)
    high_risk_tool: str | None = "request_payment"
    high_risk_arguments: dict[str, Any] = field(default_factory=lambda: {
        "amount": "12.50", "currency": "EUR", "payee": "ACME Supplies"})
    expired_key: str | None = None
    expired_tool: str | None = None
    expired_arguments: dict[str, Any] | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    settings: dict[str, Any] = field(default_factory=dict)  # the advertisement, once read

    def key(self, name: str) -> str:
        return f"conf-{self.run_id}-{name}"

    def connect(self) -> Connection:
        return Connection(self.url, self.token, self.version)


@dataclass
class Check:
    name: str
    status: str  # pass, fail, skip
    saw: str
    section: str = ""


class Skip(Exception):
    pass


class Failed(Exception):
    pass


def expect(condition: bool, saw: str) -> None:
    if not condition:
        raise Failed(saw)


# --- reading answers (section 6) -----------------------------------------------------------------


def error_of(result: dict[str, Any]) -> dict[str, Any] | None:
    if not result.get("isError"):
        return None
    return (result.get("structuredContent") or {}).get("error") or {"class": None, "message": str(result)[:200]}


def idempotency_of(result: dict[str, Any]) -> dict[str, Any]:
    return (result.get("structuredContent") or {}).get("idempotency") or {}


def replayed(result: dict[str, Any], settings: dict[str, Any]) -> Any:
    return (result.get("_meta") or {}).get(settings.get("replayedMeta", "io.idemops/replayed"))


def business(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (result.get("structuredContent") or {}).items() if k != "idempotency"}


def brief(result: dict[str, Any]) -> str:
    error = error_of(result)
    if error:
        return f"error {error.get('class')} ({str(error.get('message'))[:80]})"
    return f"result {json.dumps(business(result))[:80]} replayed={replayed(result, {})} " \
           f"operation_id={idempotency_of(result).get('operation_id')}"


async def settle(conn: Connection, tool: str, arguments: dict[str, Any], key: str,
                 seen: list[dict[str, Any]], deadline: float = 30) -> dict[str, Any]:
    """Call until the answer is not `in_progress`, honouring retry_after (section 6.3)."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + deadline
    while True:
        result = await conn.call(tool, arguments, key)
        seen.append(result)
        error = error_of(result)
        if not error or error.get("class") != "in_progress" or loop.time() > ends:
            return result
        await asyncio.sleep(min(float(error.get("retry_after") or 0.2), 1.0))


async def get_operation(conn: Connection, settings: dict[str, Any], **lookup: Any) -> dict[str, Any]:
    result = await conn.call(settings.get("getOperationTool", "get_operation"), lookup)
    expect(not result.get("isError"), f"get_operation {lookup} answered {brief(result)}")
    return result.get("structuredContent") or {}


def declaration(tools: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for tool in tools:
        if tool.get("name") == name:
            return (tool.get("_meta") or {}).get(EXTENSION)
    return None


# --- the scenarios -------------------------------------------------------------------------------


async def advertised(o: Options) -> str:
    async with o.connect() as conn:
        settings = conn.advertisement()
        expect(settings is not None, f"the capabilities do not advertise {EXTENSION}: {conn.capabilities}")
        assert settings is not None  # expect() has failed the scenario otherwise
        expect(conn.protocol == o.version, f"negotiated {conn.protocol}, not {o.version}")
        expect(bool(settings.get("version")), f"the advertisement has no version: {settings}")
        o.settings = settings
        tools = await conn.tools()
    declared = declaration(tools, o.tool)
    expect(declared is not None and declared.get("key") == "required",
           f"tool {o.tool} declares no key: _meta[{EXTENSION}] = {declared}")
    keyless = [t["name"] for t in tools if declaration([t], t["name"]) is None]
    return f"version {settings['version']}; {o.tool} declares {declared}; {len(keyless)} tools take no key"


async def storm(o: Options) -> str:
    key = o.key("storm")

    async def one() -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        async with o.connect() as conn:
            await settle(conn, o.tool, o.arguments, key, seen)
        return seen

    answers = await asyncio.gather(*(one() for _ in range(o.storm)))
    finals = [seen[-1] for seen in answers]
    errors = [brief(r) for r in finals if error_of(r)]
    expect(not errors, f"{len(errors)} of {o.storm} calls ended in errors: {errors[:3]}")
    results = {json.dumps(business(r), sort_keys=True) for r in finals}
    operations = {idempotency_of(r).get("operation_id") for r in finals}
    fresh = [r for seen in answers for r in seen if not error_of(r) and replayed(r, o.settings) is False]
    in_progress = sum(1 for seen in answers for r in seen if (error_of(r) or {}).get("class") == "in_progress")
    expect(len(results) == 1 and len(operations) == 1,
           f"{len(results)} distinct results, operation ids {operations}")
    expect(len(fresh) == 1, f"{len(fresh)} answers were not marked replayed (one execution answers unmarked)")
    return f"{o.storm} concurrent calls, one result ({operations.pop()}), 1 unmarked + " \
           f"{o.storm - 1} replays, {in_progress} in_progress answers on the way"


async def replay(o: Options) -> str:
    key = o.key("replay")
    async with o.connect() as conn:
        first = await settle(conn, o.tool, o.arguments, key, [])
        second = await conn.call(o.tool, o.arguments, key)
        expect(not error_of(first), f"first call: {brief(first)}")
        expect(replayed(first, o.settings) is False, f"first answer's replay marker: {first.get('_meta')}")
        expect(replayed(second, o.settings) is True, f"second answer's replay marker: {second.get('_meta')}")
        expect(business(second) == business(first), f"second result differs: {brief(second)} vs {brief(first)}")
        handle = idempotency_of(second).get("operation_id")
        expect(bool(handle) and handle == idempotency_of(first).get("operation_id"),
               f"operation ids {idempotency_of(first)} / {idempotency_of(second)}")
        found = await get_operation(conn, o.settings, operation_id=handle)
        expect(found.get("status") == "succeeded" and found.get("result") == business(first),
               f"get_operation({handle}) answered {found}")
    return f"second answer identical, marked replayed; get_operation({handle}) succeeded with the same result"


def conflicting(arguments: dict[str, Any]) -> dict[str, Any]:
    """The default other arguments: the first item's quantity (or first number) changed."""
    other = copy.deepcopy(arguments)
    if other.get("items"):
        other["items"][0]["quantity"] = int(other["items"][0].get("quantity", 1)) + 1
        return other
    for name, value in other.items():
        if isinstance(value, int) and not isinstance(value, bool):
            other[name] = value + 1
            return other
    raise Skip("cannot derive other arguments: give --conflict-arguments")


async def conflict(o: Options) -> str:
    key = o.key("conflict")
    other = o.conflict_arguments or conflicting(o.arguments)
    changed = {name for name in set(o.arguments) | set(other) if o.arguments.get(name) != other.get(name)}
    async with o.connect() as conn:
        first = await settle(conn, o.tool, o.arguments, key, [])
        expect(not error_of(first), f"first call: {brief(first)}")
        second = await conn.call(o.tool, other, key)
    error = error_of(second) or {}
    fields = error.get("differing_fields") or []
    expect(error.get("class") == "conflict", f"other arguments answered {brief(second)}")
    expect(bool(fields) and all(f.split("[")[0].split(".")[0] in changed for f in fields),
           f"differing_fields {fields} do not name the changed arguments {sorted(changed)}")
    return f"conflict naming {fields}"


async def invalid_key(o: Options) -> str:
    async with o.connect() as conn:
        refused = [await conn.call(o.tool, o.arguments, bad) for bad in ("has spaces", "x" * 256, "")]
        classes = [(error_of(r) or {}).get("class") for r in refused]
        expect(classes == ["invalid_input"] * 3, f"invalid keys answered {[brief(r) for r in refused]}")
        # Nothing was claimed: a valid key then runs as a first execution.
        after = await settle(conn, o.tool, o.arguments, o.key("after-invalid"), [])
        expect(not error_of(after) and replayed(after, o.settings) is False, f"then a valid key: {brief(after)}")
    return "a key with spaces, a 256-character key and an empty key: invalid_input; a valid key then executes"


async def in_progress(o: Options) -> str:
    if not o.slow_tool:
        raise Skip("no --slow-tool: a tool that runs long enough to be seen running")
    key = o.key("in-progress")
    async with o.connect() as conn:
        first = await conn.call(o.slow_tool, o.slow_arguments, key)
        first_error = error_of(first)
        if not first_error:
            raise Skip(f"{o.slow_tool} finished before a second call could see it running")
        expect(first_error.get("class") == "in_progress", f"first call: {brief(first)}")
        again = await conn.call(o.slow_tool, o.slow_arguments, key)
        handle = idempotency_of(first).get("operation_id")
        expect((error_of(again) or {}).get("class") in ("in_progress", None), f"second call: {brief(again)}")
        expect(bool(handle) and idempotency_of(again).get("operation_id") == handle,
               f"handles {idempotency_of(first)} / {idempotency_of(again)}")
        expect(isinstance(first_error.get("retry_after"), int | float), f"no retry_after: {first_error}")
        found = await get_operation(conn, o.settings, operation_id=handle)
        expect(found.get("operation_id") == handle and found.get("status") in ("processing", "succeeded"),
               f"get_operation({handle}) answered {found}")
    return f"in_progress with handle {handle} and retry_after; get_operation answered {found.get('status')}"


async def lost_answer(o: Options) -> str:
    key = o.key("lost")
    async with o.connect() as conn:
        await conn.abandon(conn.call_message(o.tool, o.arguments, key))
        loop = asyncio.get_running_loop()
        ends, found = loop.time() + 30, {}
        while loop.time() < ends:
            try:
                found = await get_operation(conn, o.settings, tool=o.tool, idempotency_key=key)
            except Failed:
                found = {}
            if found.get("status") == "succeeded":
                break
            await asyncio.sleep(0.1)
        expect(found.get("status") == "succeeded", f"the abandoned call never succeeded: {found}")
        again = await conn.call(o.tool, o.arguments, key)
    expect(not error_of(again) and replayed(again, o.settings) is True, f"the retry answered {brief(again)}")
    expect(idempotency_of(again).get("operation_id") == found.get("operation_id")
           and business(again) == found.get("result"), f"the retry {brief(again)} is not the operation {found}")
    return f"the answer was dropped; the retry got the same result, marked replayed ({found['operation_id']})"


async def broken_stream(o: Options) -> str:
    if o.version != MODERN:
        raise Skip("a re-issued request after a broken stream is 2026-07-28's recovery (section 8)")
    key = o.key("broken")
    seen: list[dict[str, Any]] = []
    async with o.connect() as conn:
        message = conn.call_message(o.tool, o.arguments, key)
        breaks = 0
        for delay in (0.0, 0.005, 0.02):  # break the stream at once and mid-flight, re-issuing each time
            try:
                await asyncio.wait_for(conn.abandon(message), timeout=delay or 0.001)
            except TimeoutError:
                pass
            breaks += 1
        final = await settle(conn, o.tool, o.arguments, key, seen)
        found = await get_operation(conn, o.settings, tool=o.tool, idempotency_key=key)
    expect(not error_of(final), f"the re-issued request answered {brief(final)}")
    expect(idempotency_of(final).get("operation_id") == found.get("operation_id"),
           f"answer {idempotency_of(final)} vs get_operation {found}")
    return f"{breaks} broken streams then a re-issued request: one operation {found.get('operation_id')}, " \
           f"answer replayed={replayed(final, o.settings)}"


async def retention(o: Options) -> str:
    if not o.expired_key:
        raise Skip("no --expired-key: the server cannot be made to expire a key from outside")
    tool = o.expired_tool or o.tool
    async with o.connect() as conn:
        declared = declaration(await conn.tools(), tool) or {}
        result = await conn.call(tool, o.expired_arguments or o.arguments, o.expired_key)
    after = declared.get("afterRetention")
    if after == "expired":
        expect((error_of(result) or {}).get("class") == "expired", f"expired key answered {brief(result)}")
    else:
        expect(after == "new_operation", f"{tool} declares afterRetention {after!r}")
        expect(not error_of(result) and replayed(result, o.settings) is False,
               f"expired key of a new_operation tool answered {brief(result)}")
    return f"{tool} (afterRetention {after}) answered {brief(result)}"


async def high_risk(o: Options) -> str:
    if not o.high_risk_tool:
        raise Skip("no --high-risk-tool")
    async with o.connect() as conn:
        declared = declaration(await conn.tools(), o.high_risk_tool)
        if not declared or not declared.get("requiresOperationId"):
            raise Skip(f"{o.high_risk_tool} does not declare requiresOperationId")
        own = await conn.call(o.high_risk_tool, o.high_risk_arguments, o.key("own"))
        expect((error_of(own) or {}).get("class") == "invalid_input"
               and (error_of(own) or {}).get("operation_id_required") is True, f"a key of our own: {brief(own)}")
        prepare = o.settings.get("prepareOperationTool", "prepare_operation")
        issued = await conn.call(prepare, {"tool": o.high_risk_tool, "arguments": o.high_risk_arguments},
                                 o.key("prepare"))
        operation_id = (issued.get("structuredContent") or {}).get("operation_id")
        expect(not error_of(issued) and bool(operation_id), f"{prepare} answered {brief(issued)}")
        assert isinstance(operation_id, str)  # expect() has failed the scenario otherwise
        first = await settle(conn, o.high_risk_tool, o.high_risk_arguments, operation_id, [])
        second = await conn.call(o.high_risk_tool, o.high_risk_arguments, operation_id)
    expect(not error_of(first) and idempotency_of(first).get("operation_id") == operation_id,
           f"called with the issued id: {brief(first)}")
    expect(replayed(second, o.settings) is True and business(second) == business(first),
           f"again with the issued id: {brief(second)}")
    return f"own key refused (operation_id_required); issued {operation_id} ran once and replays"


SCENARIOS: dict[str, tuple[str, Callable[[Options], Awaitable[str]]]] = {
    "advertised": ("2, 3", advertised),
    "storm": ("5.1", storm),
    "replay": ("5.2, 6.1", replay),
    "conflict": ("5.3", conflict),
    "invalid-key": ("4", invalid_key),
    "in-progress": ("5.4, 7", in_progress),
    "lost-answer": ("5.2, 8", lost_answer),
    "broken-stream": ("8", broken_stream),
    "retention": ("5.6", retention),
    "high-risk": ("9", high_risk),
}


async def run(o: Options, only: list[str] | None = None) -> list[Check]:
    checks = []
    for name, (section, scenario) in SCENARIOS.items():
        if only and name not in only and name != "advertised":
            continue
        try:
            checks.append(Check(name, "pass", await scenario(o), section))
        except Skip as skip:
            checks.append(Check(name, "skip", str(skip), section))
        except (Failed, WireError) as failure:
            checks.append(Check(name, "fail", str(failure), section))
        if name == "advertised" and checks[-1].status == "fail":
            break  # nothing else can be read without the advertisement
    return checks
