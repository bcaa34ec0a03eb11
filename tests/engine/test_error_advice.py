"""What agents are told agrees with what the server does: one rule per error class, real limits in schemas."""

import re
from pathlib import Path

import pytest

from tests.support.api_support import make_task
from tools_app import engine
from tools_app.conf import conf
from tools_app.core.errors import (
    INTERNAL_ERROR_ADVICE,
    PERMISSION_DENIED_ADVICE,
    UNKNOWN_OUTCOME_ADVICE,
    UnknownOutcome,
)
from tools_app.engine import Operation
from tools_app.mcp.server import build_server
from tools_app.models import RecordStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def readme_advice(error_class: str) -> str:
    """The README error table's 'what the agent should do' cell for `error_class`."""
    row = re.search(rf"^\| `{error_class}` \|[^|]*\|([^|]*)\|$", README, re.MULTILINE)
    assert row, f"no README row for {error_class}"
    return row.group(1).strip()


def unknown_operation(tenant, key="u-1"):
    return Operation(tenant_id=tenant.pk, tool="request_payment", key=key, arguments={"amount": "1"},
                     actor="agent:acme/test", transactional=False)


def test_unknown_outcome_has_one_rule_in_the_instructions_the_readme_and_every_answer(tenant):
    def lost_answer(record):
        raise UnknownOutcome(f"no answer came back; its outcome is being reconciled: {UNKNOWN_OUTCOME_ADVICE}")

    def crashes(record):
        raise RuntimeError("bug after the request went out")

    first = engine.run(unknown_operation(tenant), lost_answer)
    follower = engine.run(unknown_operation(tenant), lost_answer)
    unexpected = engine.run(unknown_operation(tenant, key="u-2"), crashes)

    assert first.record.status == RecordStatus.UNKNOWN
    for outcome in (first, follower, unexpected):
        assert outcome.error.error_class == "unknown_outcome"
        assert UNKNOWN_OUTCOME_ADVICE in outcome.error.message
    assert UNKNOWN_OUTCOME_ADVICE in build_server().instructions
    assert UNKNOWN_OUTCOME_ADVICE in readme_advice("unknown_outcome")
    assert "do not retry" not in build_server().instructions.replace("do not retry with a new key", "").replace(
        INTERNAL_ERROR_ADVICE, "")


def test_downstream_conflict_advice_is_the_same_in_the_instructions_and_the_readme():
    instructions, advice = build_server().instructions, readme_advice("downstream_conflict")

    for words in ("operator", "new key"):
        assert words in advice and words in instructions


def test_permission_denied_tells_the_agent_to_re_authorize_or_ask_a_person_in_the_instructions_and_the_readme():
    instructions, advice = build_server().instructions, readme_advice("permission_denied")

    assert PERMISSION_DENIED_ADVICE in instructions and PERMISSION_DENIED_ADVICE in advice
    for words in ("re-authorize", "ask a person"):
        assert words in PERMISSION_DENIED_ADVICE
    assert advice != "do not retry"


# --- wait_seconds --------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["get_task_status", "get_task_result"])
def test_the_schema_states_the_real_wait_limit_and_a_longer_wait_is_invalid_input(tool, tenant, settings):
    limit = conf().task_max_wait_seconds
    schema = get_tool(tool).input_model.model_json_schema()["properties"]["wait_seconds"]
    task = make_task(tenant, result={"document_id": 1})  # succeeded: waiting ends at once
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")

    too_long = call_tool(get_tool(tool), caller, {"task_id": str(task.pk), "wait_seconds": limit + 1})
    at_limit = call_tool(get_tool(tool), caller, {"task_id": str(task.pk), "wait_seconds": limit})

    assert schema["maximum"] == limit and f"at most {limit:g}" in schema["description"]
    assert too_long.error.error_class == "invalid_input" and "wait_seconds" in too_long.error.message
    assert at_limit.error is None
