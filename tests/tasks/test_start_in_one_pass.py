"""A long tool starts in one pass: its arguments are validated once per call (before the key is
claimed, kept for the fingerprint and the task), it runs as start_task's operation without a tool
call inside the tool call, and the task comes back as a value: the one task of the key's record."""

import pytest
from pydantic import Field, field_validator

from idemops.tools import Pipeline, Step, StrictModel, WriteInput, long_tool
from tools_app.models import Task
from tools_app.tasks import agent_view
from tools_app.toolkit import registry
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

VALIDATED: list[str] = []


class CountedInput(WriteInput):
    title: str = Field(max_length=100)

    @field_validator("title")
    @classmethod
    def counted(cls, title: str) -> str:
        VALIDATED.append(title)
        return title


class CountedOutput(StrictModel):
    done: bool


def nothing(ctx):
    return {}


@pytest.fixture
def counted_tool(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    VALIDATED.clear()
    return long_tool(name="counted_job", title="A counted job", description="Counts its validations.",
                     input_model=CountedInput, output_model=CountedOutput,
                     pipeline=Pipeline(steps=(Step("nothing", nothing),)), personal_fields=frozenset())


def test_a_direct_call_of_a_long_tool_validates_its_arguments_once_and_hands_back_its_task(
        transactional_db, caller, counted_tool):
    spec = get_tool("counted_job")

    # when the long tool is called directly (its key in the arguments), then again with the key
    started, task = agent_view.start_through_engine(spec, caller, {"title": "first", "idempotency_key": "k-1"}, None)
    assert VALIDATED == ["first"]
    again, same = agent_view.start_through_engine(spec, caller, {"title": "first", "idempotency_key": "k-1"}, None)

    # then each call validated the arguments once, and the task each got is the record's one task
    assert VALIDATED == ["first", "first"]
    assert started.error is None and again.error is None and again.replayed
    assert task.pk == same.pk == Task.objects.get(record=started.record).pk
    assert Task.objects.count() == 1
    assert started.result["task_id"] == str(task.pk)


def test_start_task_naming_a_long_tool_validates_the_inner_arguments_once(transactional_db, caller, counted_tool):
    # when start_task is called for it, and with an argument its model refuses
    started = call_tool(get_tool("start_task"), caller, {"tool": "counted_job", "arguments": {"title": "second"},
                                                         "idempotency_key": "k-2"})
    refused = call_tool(get_tool("start_task"), caller, {"tool": "counted_job", "arguments": {"title": "x" * 101},
                                                         "idempotency_key": "k-3"})

    # then the inner arguments were validated once for the call that started a task, and the refused one
    # left no task
    assert started.error is None and VALIDATED == ["second"]
    assert refused.error is not None and refused.error.error_class == "invalid_input"
    assert [task.arguments["title"] for task in Task.objects.all()] == ["second"]  # stored encrypted: read back
