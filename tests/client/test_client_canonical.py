"""The client derives keys from the server's canonical form of the arguments, reimplemented on its side."""

import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from idemops_client import canonical
from tools_app.core import keys
from tools_app.core.errors import InvalidInput

TRICKY = [
    None, True, False, 0, -0.0, 0.0, Decimal("0.000"), 1, 1.0, Decimal("1.00"), -7, 2.5, Decimal("2.50"),
    "2.50", 0.1, 1e21, 1.5e-7, Decimal("1E+2"), 12345678901234567890, 3.14159265358979,
    "", "plain", "café", "cafe\u0301", "Å", "A\u030a", "\u212b", "emoji 🙂", 'quote " and \\ backslash', "\n\t",
    [], [1, 1.0, "1"], (1, 2), {"b": 1, "a": 2}, {"cafe\u0301": 1}, {"z": {"y": [{"b": 2, "a": 1}]}},
    {"items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": Decimal("2.50")}], "customer": "ACME"},
    {"1": "one", "10": "ten", "2": "two"}, {"True": True, "None": None},
    datetime(2026, 11, 30, 12, 0, tzinfo=UTC), datetime(2026, 11, 30, 13, 0, tzinfo=timezone(timedelta(hours=1))),
    datetime(2026, 11, 30, 12, 0), date(2026, 11, 30), uuid.UUID("12345678-1234-5678-1234-567812345678"),
]


@pytest.mark.parametrize("value", TRICKY, ids=repr)
def test_client_and_server_write_the_same_canonical_form(value):
    assert canonical.canonical_json(value) == keys.canonical_json(value)


def test_spellings_of_one_call_have_one_canonical_form_on_both_sides():
    spellings = [
        {"customer": "Café", "items": [{"sku": "B", "quantity": 3, "unit_price": 2.5}]},
        {"items": [{"unit_price": Decimal("2.50"), "quantity": 3.0, "sku": "B"}], "customer": "Cafe\u0301"},
        {"items": [{"quantity": Decimal("3.000"), "sku": "B", "unit_price": 2.50}], "customer": "Café"},
    ]
    assert len({canonical.canonical_json(s) for s in spellings}) == 1
    assert {canonical.canonical_json(s) for s in spellings} == {keys.canonical_json(s) for s in spellings}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("-Infinity")])
def test_non_finite_numbers_are_refused_by_both(value):
    with pytest.raises(ValueError):
        canonical.canonical_json({"amount": value})
    with pytest.raises(InvalidInput):
        keys.canonical_json({"amount": value})


def test_a_derived_key_is_stable_for_a_replanned_call_and_valid_for_the_server():
    first = canonical.derive_key("chat-42", "create_order", {"customer": "ACME", "qty": 3})
    again = canonical.derive_key("chat-42", "create_order", {"qty": 3.0, "customer": "ACME"})

    assert first == again
    assert keys.validate_key(first) == first


@pytest.mark.parametrize("other", [
    ("chat-43", "create_order", {"customer": "ACME", "qty": 3}),
    ("chat-42", "create_ticket", {"customer": "ACME", "qty": 3}),
    ("chat-42", "create_order", {"customer": "ACME", "qty": 4}),
    ("chat-42", "create_order", {"customer": "ACME ", "qty": 3}),
])
def test_another_session_tool_or_argument_derives_another_key(other):
    assert canonical.derive_key(*other) != canonical.derive_key("chat-42", "create_order",
                                                                {"customer": "ACME", "qty": 3})


def test_engine_fields_and_declared_non_business_fields_are_left_out_of_the_operation():
    arguments = {"customer": "ACME", "idempotency_key": "k", "trace_id": "t-1", "note": "model's reminder"}

    assert canonical.business_arguments(arguments) == {"customer": "ACME", "note": "model's reminder"}
    assert canonical.business_arguments(arguments, frozenset({"note"})) == {"customer": "ACME"}
