"""Orders: `create_order` (write) and `get_order` (read)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from idemops.tools import NotFound, ObjectId, StrictModel, ToolContext, ToolInput, WriteInput, read_tool, write_tool
from idemops_demo.models import Order, OrderLine

# The columns' own precision, so an order that validates also fits.
_UNIT_PRICE = OrderLine._meta.get_field("unit_price")
_TOTAL = Order._meta.get_field("total")
MAX_TOTAL = Decimal(10) ** (_TOTAL.max_digits - _TOTAL.decimal_places) - Decimal(10) ** -_TOTAL.decimal_places

Money = Annotated[Decimal, Field(gt=0, max_digits=_UNIT_PRICE.max_digits, decimal_places=_UNIT_PRICE.decimal_places,
                                 description='A decimal string, e.g. "12.50" (a JSON number is accepted too).')]
Currency = Annotated[str, Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. EUR")]


class OrderItem(StrictModel):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0, le=10_000)
    unit_price: Money


def order_total(items: list[OrderItem]) -> Decimal:
    return sum((item.unit_price * item.quantity for item in items), Decimal("0"))


class CreateOrderInput(WriteInput):
    customer: str = Field(min_length=1, max_length=200)
    items: list[OrderItem] = Field(min_length=1, max_length=500,
                                   description=f"The order's lines; their total may be at most {MAX_TOTAL}.")
    currency: Currency
    note: str = Field("", max_length=1000, description="Free text for your own use (why, for whom). Not part of "
                                                         "the order and not stored: the same key with another note "
                                                         "is the same order.")

    @field_validator("items")
    @classmethod
    def total_fits(cls, items: list[OrderItem]) -> list[OrderItem]:
        if order_total(items) > MAX_TOTAL:
            raise ValueError(f"the order total (the sum of quantity times unit_price) must be at most {MAX_TOTAL}")
        return items


class OrderLineOutput(BaseModel):
    # Not the (strict) input model: the SDK validates our JSON output, where a decimal is a string.
    sku: str
    quantity: int
    unit_price: Decimal


class OrderOutput(BaseModel):
    order_id: int
    customer: str
    currency: str
    total: str = Field(description="Decimal string, e.g. 12.50")
    items: list[OrderLineOutput]
    created_at: datetime


class GetOrderInput(ToolInput):
    order_id: ObjectId


def order_output(order: Order, lines: list[OrderLine]) -> OrderOutput:
    return OrderOutput(
        order_id=order.pk, customer=order.customer, currency=order.currency, total=f"{order.total:.2f}",
        items=[OrderLineOutput(sku=line.sku, quantity=line.quantity, unit_price=line.unit_price) for line in lines],
        created_at=order.created_at,
    )


@write_tool(name="create_order", title="Create an order",
            non_business_fields=frozenset({"note"}), personal_fields=frozenset({"customer", "note"}),
            # Operators and auditors find an order's record by its id (the result's) and currency.
            search_fields=frozenset({"order_id", "currency"}))
def create_order(ctx: ToolContext, args: CreateOrderInput) -> OrderOutput:
    """Create an order with its lines and return its id and total. Requires idempotency_key: a retry with
    the same key returns the same order instead of creating another."""
    order = Order.objects.create(tenant_id=ctx.tenant_id, record=ctx.record, customer=args.customer,
                                 currency=args.currency, total=order_total(args.items))
    lines = OrderLine.objects.bulk_create(
        OrderLine(order=order, sku=item.sku, quantity=item.quantity, unit_price=item.unit_price)
        for item in args.items)
    return order_output(order, lines)


@read_tool(name="get_order", title="Get an order",
           personal_fields=frozenset())
def get_order(ctx: ToolContext, args: GetOrderInput) -> OrderOutput:
    """Read one of this tenant's orders by id."""
    order = Order.objects.filter(tenant_id=ctx.tenant_id, pk=args.order_id).prefetch_related("lines").first()
    if order is None:
        raise NotFound(f"no order {args.order_id} in this tenant")
    return order_output(order, list(order.lines.all()))
