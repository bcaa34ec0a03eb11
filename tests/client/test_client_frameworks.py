"""The framework adapters and the synchronous client (issue 25 §4), against the live server.

Each framework runs its own agent loop with a scripted model (no network): the model places an
order, then re-plans the identical order spelled differently (keys reordered, 3 as 3.0), then
answers. One order is made, the second tool output says it came from the ledger, and the model's
instructions on its last turn carry the ledger's summary with the order.
"""

import asyncio
import json

import pytest

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy
from idemops_demo.models import Order

pytestmark = pytest.mark.live

QUICK = RetryPolicy(max_attempts=6, max_seconds=60, base_delay=0.05, max_delay=0.5, attempt_timeout=10)
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
REPLANNED = {"items": [{"unit_price": "2.50", "quantity": 3.0, "sku": "BOLT-1"}], "currency": "EUR", "customer": "ACME"}


def test_an_openai_agents_run_with_a_replanned_identical_order_makes_one_order(web_server, token):
    from agents import Agent, RunConfig, Runner
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from idemops_client.adapters.openai_agents import idemops_tools, ledger_instructions

    def call(n, arguments):
        return ResponseFunctionToolCall(type="function_call", id=f"fc_{n}", call_id=f"call_{n}", name="create_order",
                                        arguments=json.dumps(arguments), status="completed")

    class Scripted(Model):
        def __init__(self):
            self.turns = [call(1, ORDER), call(2, REPLANNED), ResponseOutputMessage(
                type="message", id="msg_1", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text="Ordered.", annotations=[])])]
            self.instructions = []

        async def get_response(self, system_instructions, input, *args, **kwargs):
            self.instructions.append(system_instructions)
            return ModelResponse(output=[self.turns.pop(0)], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    async def scenario():
        async with IdempotentClient(web_server.mcp_url, token, ledger=MemoryLedger(), policy=QUICK) as client:
            model = Scripted()
            agent = Agent(name="clerk", instructions=ledger_instructions(client, "You place orders."), model=model,
                          tools=await idemops_tools(client, {"create_order", "get_order"}))
            result = await Runner.run(agent, "Order 3 bolts for ACME", run_config=RunConfig(tracing_disabled=True))
            outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
            return result.final_output, outputs, model.instructions

    final, outputs, instructions = asyncio.run(scenario())

    order = Order.objects.get()
    assert final == "Ordered." and len(outputs) == 2
    assert json.loads(outputs[0])["order_id"] == order.pk
    assert "Answered from the ledger" in outputs[1] and f'"order_id": {order.pk}' in outputs[1]
    assert "No tool calls with side effects" in instructions[0]
    assert f"create_order(customer=ACME, currency=EUR, 1 item) → done, order {order.pk}" in instructions[-1]


def test_a_pydantic_ai_run_with_a_replanned_identical_order_makes_one_order(web_server, token):
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from idemops_client.adapters.pydantic_ai import idemops_tools, ledger_instructions

    seen = []

    def script(messages, info):
        seen.append(info.instructions)
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("create_order", ORDER, tool_call_id="c1")])
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("create_order", REPLANNED, tool_call_id="c2")])
        return ModelResponse(parts=[TextPart("Ordered.")])

    async def scenario():
        async with IdempotentClient(web_server.mcp_url, token, ledger=MemoryLedger(), policy=QUICK) as client:
            agent = Agent(FunctionModel(script), tools=await idemops_tools(client, {"create_order"}),
                          instructions=ledger_instructions(client, "You place orders."))
            result = await agent.run("Order 3 bolts for ACME")
            returns = [part.content for message in result.all_messages() for part in message.parts
                       if isinstance(part, ToolReturnPart)]
            return result.output, returns

    final, returns = asyncio.run(scenario())

    order = Order.objects.get()
    assert final == "Ordered." and len(returns) == 2
    assert json.loads(returns[0])["order_id"] == order.pk
    assert "Answered from the ledger" in returns[1]
    assert "No tool calls with side effects" in seen[0]
    assert f"create_order(customer=ACME, currency=EUR, 1 item) → done, order {order.pk}" in seen[-1]


def test_the_synchronous_client_makes_one_order_for_two_identical_calls(web_server, token):
    with IdempotentClient.sync(web_server.mcp_url, token, ledger=MemoryLedger(), policy=QUICK) as client:
        first = client.call("create_order", ORDER)
        second = client.call("create_order", REPLANNED)
        entries = client.ledger.entries()

    assert first["order_id"] == second["order_id"] == Order.objects.get().pk
    assert not first.from_ledger and second.from_ledger and len(entries) == 1
    assert first.trace_id and len(first.trace_id) == 32
