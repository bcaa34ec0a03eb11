from collections import OrderedDict
from datetime import date
from decimal import Decimal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tools_app.core import keys
from tools_app.core.errors import InvalidInput
from tools_app.core.keys import canonical_json, digest, validate_key


def test_key_order_does_not_change_the_fingerprint():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})


def test_equal_numbers_have_one_form():
    assert canonical_json([1, 1.0, Decimal("1.00"), Decimal("1E0")]) == "[1,1,1,1]"
    assert canonical_json(Decimal("12.50")) == "12.5"
    assert canonical_json(-0.0) == "0"


def test_unicode_is_normalized_to_nfc():
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert digest({"name": composed}) == digest({"name": decomposed})


def test_list_order_matters():
    assert digest([1, 2]) != digest([2, 1])


def test_a_string_is_not_a_number():
    assert digest({"x": "1"}) != digest({"x": 1})


def test_it_rejects_non_finite_numbers():
    with pytest.raises(InvalidInput):
        canonical_json(float("nan"))


@pytest.mark.parametrize("key", ["a", "order-1", "A.b_c:d-9", "x" * 255])
def test_it_accepts_keys_following_the_rule(key):
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", "x" * 256, "has space", "semi;colon", "ключ", None, 42])
def test_it_rejects_other_keys_with_the_rule_in_the_message(key):
    with pytest.raises(InvalidInput, match=r"1-255 characters from A-Z a-z 0-9 \. _ : -"):
        validate_key(key)


# JSON-like values, plain or not: text of any script (NFC or not), integers of any size, finite floats,
# decimals (amounts, and any finite one), dates, times and UUIDs, booleans, nulls, lists, tuples and
# dicts of them.
JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**27, max_value=10**40).map(lambda n: n | 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.decimals(allow_nan=False, allow_infinity=False)
    | st.decimals(min_value=0, max_value=10**6, places=2) | st.datetimes() | st.datetimes(timezones=st.timezones())
    | st.dates() | st.uuids() | st.text() | st.text(alphabet="abcAB09 _-\"\\\n")
    | st.text(alphabet="ae\u0301\u030aA\u212b\u00e9\u00c5"),
    lambda children: st.lists(children, max_size=5) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=8) | st.sampled_from(["a", "b", "sku", "B", "10", "2", "cafe\u0301", "é"]),
                      children, max_size=5),
    max_leaves=30)


@settings(max_examples=1500, deadline=None)
@given(JSON_LIKE)
@example(10**28 + 1)  # rounded to 28 digits by the walk
@example("cafe\u0301")  # written in NFC by the walk
@example({"cafe\u0301": 1, "b": 2})  # a key in NFC, and sorted as such
def test_the_fast_canonical_form_is_the_walked_one_byte_for_byte(value):
    """canonical_json writes a plain value with the C encoder: the bytes of every stored fingerprint
    must not change, so it must equal the Python walk on anything."""
    assert canonical_json(value) == keys._canonical(value)


@pytest.mark.parametrize("value", [
    {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3}], "express": True, "note": None},
    ["a", 1, -2, [], {}, (1, "b")], 10**28 - 1, -(10**28 - 1), "tab\there \"quoted\" \\",
])
def test_plain_arguments_take_the_encoder(value):
    assert keys._plain(value)
    assert canonical_json(value) == keys._canonical(value)


@pytest.mark.parametrize("value", [
    10**28, -(10**28), 1.0, Decimal("2.50"), "café", {"cafe\u0301": 1}, [1, 2.5], Decimal("1E+30"),
    {"items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": Decimal("2.50")}], "at": date(2026, 12, 5)},
])
def test_what_the_encoder_would_write_otherwise_is_handed_to_it_in_the_form_it_writes_as_the_walk(value):
    assert not keys._plain(value)
    assert canonical_json(value) == keys._canonical(value) == keys._PLAIN_ENCODER(keys._encodable(value))


@pytest.mark.parametrize("value", [
    OrderedDict(a=1), {1: "a"}, Decimal("0.0000001"), 1e-7, {"cafe\u0301": 1, "café": 2}, Decimal("1E+5000"),
])
def test_what_the_encoder_cannot_write_as_the_walk_does_is_walked(value):
    """A type of its own, a number whose float repr is in exponent notation (or too long for int()),
    two keys with one NFC form."""
    with pytest.raises(keys._Walk):
        keys._encodable(value)
    assert canonical_json(value) == keys._canonical(value)
