"""The public tool API (`idemops.tools`) keeps its names and their signatures.

public_api_surface.txt is the surface adopters rely on. A name that disappears or whose signature
changes fails here: that is an incompatible change, which needs a new major API_VERSION (and the file
written anew: `python -m tests.platform.public_api_surface > tests/platform/public_api_surface.txt`).
New names, new enum members, new model fields, new keyword-only parameters with a default at the end of
a signature and new dataclass fields at the end are compatible and pass (a new minor API_VERSION).
"""

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.platform.public_api_surface import surface

SURFACE = Path(__file__).with_name("public_api_surface.txt")
# The kinds of line whose list may grow without breaking anyone: enum members, a model's fields.
GROWING = re.compile(r"^(?P<name>\w+): (?P<kind>enum|django model) (?P<items>\[.*\])$")
# A callable `name(*, params) -> result` and a dataclass `Name: dataclass (fields) properties [...]`.
CALLABLE = re.compile(r"^(?P<head>\w+\()(?P<params>.*)(?P<tail>\) -> .*)$")
DATACLASS = re.compile(r"^(?P<head>\w+: dataclass \()(?P<params>.*)(?P<tail>\) properties .*)$")


def _top_level(params):
    """The comma-separated parts of a parameter list, commas inside brackets kept."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(params):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(params[start:i].strip())
            start = i + 1
    return [*parts, params[start:].strip()] if params.strip() else parts


def _only_grown(line, now):
    """True when `now` is `line` with parameters (callables: keyword-only, with a default) added at the end."""
    for shape in (CALLABLE, DATACLASS):
        was, became = shape.match(line), shape.match(now)
        if not (was and became and was["head"] == became["head"] and was["tail"] == became["tail"]):
            continue
        old, new = _top_level(was["params"]), _top_level(became["params"])
        if new[:len(old)] != old or len(new) == len(old):
            return False
        keyword_only = shape is DATACLASS or "*" in old
        return keyword_only and (shape is DATACLASS or all(" = " in extra for extra in new[len(old):]))
    return False


def _by_name(lines):
    return {re.match(r"\w+", line).group(0): line for line in lines}


def test_every_name_adopters_use_is_still_there_with_its_signature():
    # given
    recorded, current = _by_name(SURFACE.read_text().splitlines()), _by_name(surface())

    # then
    assert sorted(set(recorded) - set(current)) == [], "names removed from idemops.tools"
    changed = []
    for name, line in recorded.items():
        now = current[name]
        grows, grown = GROWING.match(line), GROWING.match(now)
        if grows and grown and grows["kind"] == grown["kind"]:
            if not set(ast.literal_eval(grows["items"])) <= set(ast.literal_eval(grown["items"])):
                changed.append(f"{line}\n  is now\n{now}")
        elif line != now and not _only_grown(line, now):
            changed.append(f"{line}\n  is now\n{now}")
    assert changed == [], "\n\n".join(changed)


def test_a_signature_that_only_gains_defaulted_keywords_is_compatible_and_one_that_loses_one_is_not():
    before = "write_tool(*, name: 'str', keep: 'KeepFor' = KeepFor(records=None, tasks=None)) -> 'Handler'"
    assert _only_grown(before, before[:-len(") -> 'Handler'")] + ", downstream: 'str | None' = None) -> 'Handler'")
    assert not _only_grown(before, before[:-len(") -> 'Handler'")] + ", downstream: 'str') -> 'Handler'")
    assert not _only_grown(before, "write_tool(*, name: 'str') -> 'Handler'")
    # a positional parameter added is not keyword-only
    assert not _only_grown("f(a: 'int') -> 'None'", "f(a: 'int', b: 'int' = 1) -> 'None'")
    assert _only_grown("P: dataclass (steps: tuple[Step, ...]) properties []",
                       "P: dataclass (steps: tuple[Step, ...], deadline: timedelta | None) properties []")


def test_the_api_names_its_version_and_exports_only_what_it_lists():
    from idemops import tools

    assert re.fullmatch(r"\d+\.\d+", tools.API_VERSION)
    assert len(tools.__all__) == len(set(tools.__all__))
    assert all(hasattr(tools, name) for name in tools.__all__)


def test_docs_tools_api_names_every_name_of_the_api():
    from idemops import tools

    page = (Path(__file__).resolve().parents[2] / "docs" / "tools-api.md").read_text()
    assert [name for name in tools.__all__ if f"`{name}" not in page] == []


def test_a_declaration_the_registry_refuses_names_the_module_it_came_from():
    # given: an adopter's write tool that acts downstream without a reconciler
    from idemops.tools import ToolContext, WriteInput, write_tool
    from tools_app.toolkit.registry import _TOOLS

    class RefundInput(WriteInput):
        amount: int

    # when / then
    # (in the old flat spelling: `Reconciliation` cannot be written without its reconciler)
    refused = r"must declare a reconciler \(declared in tests\.platform\.test_public_api\)"
    with pytest.raises(TypeError, match=refused), pytest.warns(DeprecationWarning, match="transactional="):
        @write_tool(name="adopters_refund", title="Refund", personal_fields=frozenset(), transactional=False)
        def adopters_refund(ctx: ToolContext, args: RefundInput) -> RefundInput:
            return args
    assert "adopters_refund" not in _TOOLS


def test_api_1_2_reads_models_from_the_handler_and_keeps_every_old_keyword():
    """What changed in API_VERSION 1.2: `write_tool`'s and `read_tool`'s `input_model` and `output_model` are no
    longer required (the handler's annotations say them), `Retention` and `Reconciliation` group keywords, and
    every keyword of 1.1 is still accepted (deprecated), so a 1.1 declaration still runs."""
    from idemops import tools

    assert tools.API_VERSION == "2.1"  # 1.2 as below; 2.0 then changed KeepFor (issue 39 item 2); 2.1 below
    write = inspect.signature(tools.write_tool).parameters
    read = inspect.signature(tools.read_tool).parameters
    old_write = {"input_model", "output_model", "retention", "on_expiry", "keep", "transactional", "reconciler",
                 "result_for_reference", "retry_window", "approval", "confirmation", "check", "concurrency_key"}
    assert old_write <= write.keys() and {"input_model", "output_model"} <= read.keys()
    assert all(write[name].default is None for name in ("input_model", "output_model", "on_expiry", "keep",
                                                          "transactional", "reconciler"))
    assert write["retention"].default is None and write["reconciliation"].default is None
    assert {"Retention", "Reconciliation"} <= set(tools.__all__)


def test_api_2_1_types_reconcilers_and_long_tools_over_the_input_model_and_keeps_the_old_keywords():
    """What changed in API_VERSION 2.1: a reconciler is given a `SentCall` of the tool's input model,
    `Reconciliation` is generic over that model, and `long_tool` takes `retention=Retention(...)` with its
    `approval` and `operation_arguments` typed over its `input_model`; its flat `on_expiry` and `keep` are still
    accepted (deprecated, moved to the end of its keywords)."""
    from idemops import tools

    assert tools.API_VERSION == "2.1"
    assert "SentCall" in tools.__all__
    assert tools.Reconciliation.__parameters__ and tools.SentCall.__parameters__  # generic: Reconciliation[Input]
    reconciler = inspect.signature(tools.Reconciliation).parameters["reconciler"].annotation
    assert "SentCall[WriteInputT]" in str(reconciler)
    long = inspect.signature(tools.long_tool).parameters
    assert long["retention"].default is None and long["on_expiry"].default is None and long["keep"].default is None
    assert list(long)[-2:] == ["on_expiry", "keep"]
    assert all(str(long[name].annotation).count("WriteInputT") for name in ("input_model", "approval",
                                                                             "operation_arguments"))
