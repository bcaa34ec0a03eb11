"""core.jsontext: an encoder built once writes what json.dumps writes with the same options."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools_app.core import jsontext

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.text(alphabet="é\u212b\"\\\n\u2028\x00"),
    lambda children: st.lists(children, max_size=5) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)

OPTIONS = [{}, {"sort_keys": True, "ensure_ascii": False, "compact": True}, {"ensure_ascii": False, "compact": True}]


@settings(max_examples=500, deadline=None)
@given(JSON)
@pytest.mark.parametrize("options", OPTIONS)
def test_the_text_is_json_dumps_with_the_same_options(options, value):
    separators = (",", ":") if options.get("compact") else (", ", ": ")
    assert jsontext.encoder(**options)(value) == json.dumps(
        value, sort_keys=options.get("sort_keys", False), ensure_ascii=options.get("ensure_ascii", True),
        separators=separators)


def test_a_value_json_cannot_write_is_refused_as_json_dumps_refuses_it():
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        jsontext.encoder()({"a": {1}})


def test_the_encoder_is_built_once_per_set_of_options():
    assert jsontext.encoder(compact=True) is jsontext.encoder(compact=True)
    assert jsontext.encoder(compact=True) is not jsontext.encoder()
