"""Helpers shared by the in-process task tests."""

from django_q.models import OrmQ

from tools_app.access import Agent
from tools_app.models import Task
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

TEXT = "# Notes\n\nThe crane schedule moved. Pallets wait at dock four.\n\nCustoms cleared the vessel."


def agent(caller) -> Agent:
    """The tenant's agent, as the MCP tools pass it to tools_app.tasks."""
    return Agent(caller.tenant_id, caller.actor)


def start(caller, arguments, key="k-1"):
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ingest_document", "arguments": arguments, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def queued_jobs() -> int:
    return OrmQ.objects.count()
