"""The public tool API (`idemops.tools`) keeps its names and their signatures.

public_api_surface.txt is the surface adopters rely on. A name that disappears or whose signature
changes fails here: that is an incompatible change, which needs a new major API_VERSION (and the file
written anew with `python -m tests.platform.public_api_surface`). New names, new enum members and new model
fields are compatible and pass.
"""

import ast
import re
from pathlib import Path

import pytest

from tests.platform.public_api_surface import surface

SURFACE = Path(__file__).with_name("public_api_surface.txt")
# The kinds of line whose list may grow without breaking anyone: enum members, a model's fields.
GROWING = re.compile(r"^(?P<name>\w+): (?P<kind>enum|django model) (?P<items>\[.*\])$")


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
        elif line != now:
            changed.append(f"{line}\n  is now\n{now}")
    assert changed == [], "\n\n".join(changed)


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
    with pytest.raises(TypeError, match=r"must declare a reconciler \(declared in tests\.platform\.test_public_api\)"):
        @write_tool(name="adopters_refund", title="Refund", input_model=RefundInput, output_model=RefundInput,
                    personal_fields=frozenset(), transactional=False)
        def adopters_refund(ctx: ToolContext, args: RefundInput) -> RefundInput:
            return args
    assert "adopters_refund" not in _TOOLS
