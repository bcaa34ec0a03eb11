"""An adopter-style tool module for the tests of pipeline versions and durable waits.

A process imports it through IDEMOPS_TOOL_MODULES; DEPLOYED_PIPELINE says which deploy of
`ledger_sync` it is ("v1": the first; "v2": changed steps, keeping v1 runnable; "v3": changed steps,
v1 dropped). The test process declares a deploy with `declare(deploy)` into a registry it restores.
`await_callback` waits durably for the gateway's callback (or only for a time, with `sleep_seconds`).
"""

from __future__ import annotations

import os
from datetime import timedelta

from pydantic import BaseModel

from idemops.tools import Pipeline, Step, StepContext, WaitFor, WriteInput, long_tool


class LedgerInput(WriteInput):
    account: str


class LedgerResult(BaseModel):
    made_by: list[str]


def _step(label: str, *, hold: bool = False):
    def run(ctx: StepContext[LedgerInput]) -> str:
        if hold and not ctx.resume_input.get("go"):
            raise WaitFor("waiting for the go-ahead", {"go": {"message": "go on?", "schema": {"type": "boolean"}}})
        return label
    return run


def _finish(label: str):
    def run(ctx: StepContext[LedgerInput]) -> dict:
        return {"made_by": [*ctx.outputs.values(), label]}
    return run


V1 = Pipeline(steps=(Step("reserve", _step("v1:reserve")), Step("hold", _step("v1:hold", hold=True)),
                     Step("finish", _finish("v1:finish"))), version=1)


def pipeline(deploy: str) -> Pipeline:
    if deploy == "v1":
        return V1
    steps = (Step("reserve", _step(f"{deploy}:reserve")), Step("check", _step(f"{deploy}:check")),
             Step("hold", _step(f"{deploy}:hold")), Step("finish", _finish(f"{deploy}:finish")))
    if deploy == "v2":
        return Pipeline(steps=steps, version=2, previous=(V1,))
    return Pipeline(steps=steps, version=3)


def declare(deploy: str) -> None:
    long_tool(name="ledger_sync", title="Sync a ledger", description="Test tool: a pipeline that deploys change.",
              input_model=LedgerInput, output_model=LedgerResult, pipeline=pipeline(deploy),
              personal_fields=frozenset())


class AwaitInput(WriteInput):
    ref: str
    timeout_seconds: float = 600
    sleep_seconds: float = 0


class AwaitResult(BaseModel):
    ref: str
    payload: dict | None
    timed_out: bool


def request(ctx: StepContext[AwaitInput]) -> str:
    return ctx.arguments.ref


def await_callback(ctx: StepContext[AwaitInput]) -> dict:
    if ctx.arguments.sleep_seconds:
        ctx.sleep_until(timedelta(seconds=ctx.arguments.sleep_seconds), description="a pause between polls")
    payload = ctx.wait_for_event("gateway.callback", ctx.arguments.ref,
                                 timeout=timedelta(seconds=ctx.arguments.timeout_seconds),
                                 description="the gateway's callback")
    return {"payload": payload, "timed_out": payload is None}


def finish(ctx: StepContext[AwaitInput]) -> dict:
    return {"ref": ctx.outputs["request"], **ctx.outputs["await"]}


def declare_waits() -> None:
    long_tool(name="await_callback", title="Await a callback", description="Test tool: a durable wait.",
              input_model=AwaitInput, output_model=AwaitResult, personal_fields=frozenset(),
              pipeline=Pipeline(steps=(Step("request", request), Step("await", await_callback),
                                       Step("finish", finish))))


if deploy := os.environ.get("DEPLOYED_PIPELINE"):
    declare(deploy)
    declare_waits()
