"""`floor_order`: the demo's `create_order` as idemops declares it, with the floor's own statement as its body.

P10 compares idemops' `create_order` with the floor (bench/floor_mcp.py), whose tool claims the key, inserts
the order in one raw INSERT, stores the result and commits. idemops' side also runs the demo's body: two
ORM inserts (the order, then its lines) and an answer that lists the lines. This tool keeps everything of
`create_order` that idemops does (the same input model and its validation, personal and non-business fields,
search fields: so the same fingerprint, sealing, claim, audit rows and mark) and replaces the body by the
floor's: `INSERT INTO floor_order … RETURNING id` in raw SQL, answering the floor's result. So
`bench_mcp` splits P10 in the same run: `floor_order` calls/s ÷ the floor's is what idemops adds around one
business statement, and `create_order` calls/s ÷ `floor_order`'s is what the demo's body costs beyond it.

Served by bench_mcp's idemops servers only (`IDEMOPS_TOOL_MODULES=bench.floor_tool`); its table is the
floor's, which the floor's server creates when it starts (bench_mcp starts it first).
"""

from __future__ import annotations

import json
from decimal import Decimal

from django.db import connection
from pydantic import BaseModel

from idemops.tools import ToolContext, write_tool
from idemops_demo.tools.orders import CreateOrderInput, order_total


class FloorOrderOutput(BaseModel):
    """The floor's result: the order's id, its total and currency."""

    order_id: int
    total: Decimal
    currency: str


@write_tool(name="floor_order", title="Create an order (the floor's statement)",
            non_business_fields=frozenset({"note"}), personal_fields=frozenset({"customer", "note"}),
            search_fields=frozenset({"order_id", "currency"}))
def floor_order(ctx: ToolContext, args: CreateOrderInput) -> FloorOrderOutput:
    """Create an order in the floor's table in one statement (a benchmark's tool, not the demo's)."""
    total = order_total(args.items)
    items = [item.model_dump(mode="json") for item in args.items]
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO floor_order (customer, items, currency, total) VALUES (%s, %s, %s, %s) "
                       "RETURNING id", [args.customer, json.dumps(items), args.currency, total])
        (order_id,) = cursor.fetchone()
    return FloorOrderOutput(order_id=order_id, total=total, currency=args.currency)
