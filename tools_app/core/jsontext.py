"""JSON text from the standard library's C encoder, built once per shape of output.

`json.dumps` and `JSONEncoder.encode` build a new C encoder object on every call: about 2 µs, more
than encoding the small values the engine writes (arguments, results, audit details) takes. An
encoder here is built once and called for each value: the same text as `json.dumps` with the same
options, except that a value holding itself raises RecursionError instead of ValueError (no
circular-reference bookkeeping: JSON that came from JSON cannot hold itself). Where the C
accelerator is missing (another Python implementation) it is `json.dumps` itself.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from json import encoder as _std
from typing import Any

Encode = Callable[[Any], str]


@functools.cache
def encoder(*, sort_keys: bool = False, ensure_ascii: bool = True, compact: bool = False) -> Encode:
    """`json.dumps(value, sort_keys=…, ensure_ascii=…, separators=(",", ":") if compact)` as one callable."""
    separators = (",", ":") if compact else (", ", ": ")
    make = getattr(_std, "c_make_encoder", None)
    if make is None:
        return functools.partial(json.dumps, sort_keys=sort_keys, ensure_ascii=ensure_ascii, separators=separators)
    strings = _std.encode_basestring_ascii if ensure_ascii else _std.encode_basestring  # the C ones where present
    default = json.JSONEncoder().default  # raises TypeError naming the type, as json.dumps does
    chunks = make(None, default, strings, None, separators[1], separators[0], sort_keys, False, True)

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode
