from decimal import Decimal

import pytest

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
