"""The agent's client (idemops_client) reads the server's advertisement of the extension and each tool's
declaration (docs/extension/idempotency.md sections 2 and 3) instead of guessing from input schemas."""

import asyncio

import pytest
from mcp_types import Tool, ToolAnnotations

from idemops_client import IdempotentClient, MemoryLedger
from idemops_client.client import tool_info
from idemops_client.extension import IDENTIFIER, Advertisement

ADVERTISED = Advertisement(version="2026-12-01", key_meta="io.idemops/idempotency-key",
                           replayed_meta="io.idemops/replayed", get_operation_tool="get_operation",
                           prepare_operation_tool="prepare_operation")
KEYED_SCHEMA = {"type": "object", "properties": {"idempotency_key": {"type": "string"}}}


@pytest.mark.live
@pytest.mark.conformance
def test_the_client_learns_from_the_live_advertisement_which_tools_take_a_key_and_how(conformance_web, token):
    async def scenario():
        async with IdempotentClient(conformance_web.mcp_url, token, ledger=MemoryLedger()) as client:
            return await client.tools(), client.advertisement

    tools, advertisement = asyncio.run(scenario())

    assert advertisement is not None and advertisement.version and advertisement.get_operation_tool == "get_operation"
    assert tools["create_order"].writes and tools["create_order"].non_business_fields == {"note"}
    assert tools["request_payment"].requires_operation_id
    # get_operation looks an operation up by its key, and declares no key of its own: a read
    assert not tools["get_operation"].writes and not tools["get_order"].writes


def test_under_the_extension_a_tool_without_a_declaration_takes_no_key_whatever_its_schema_says():
    undeclared = Tool(name="lookup", input_schema=KEYED_SCHEMA)

    assert tool_info(undeclared, ADVERTISED).writes is False
    assert tool_info(undeclared).writes is True  # a server without the extension: guessed from the schema


def test_under_the_extension_the_declaration_decides_even_against_the_annotations():
    declared = Tool(name="charge", input_schema={"type": "object", "properties": {}},
                    annotations=ToolAnnotations(read_only_hint=True),
                    _meta={IDENTIFIER: {"key": "required", "requiresOperationId": True,
                                        "nonBusinessFields": ["sent_at"]}})

    info = tool_info(declared, ADVERTISED)

    assert (info.writes, info.requires_operation_id, info.non_business_fields) == (True, True, {"sent_at"})
