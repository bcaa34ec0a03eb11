"""The suite's layout, one rule: test folders beside the helpers' one folder, tests/support/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_helper_module_sits_flat_in_tests_every_helper_is_in_tests_support():
    flat = sorted(p.name for p in TESTS.glob("*.py") if p.name not in ("__init__.py", "conftest.py"))
    assert flat == [], f"helpers belong in tests/support/: {flat}"
    assert (TESTS / "support" / "__init__.py").read_text().startswith('"""')
    assert not list((TESTS / "support").glob("test_*.py")), "tests/support holds helpers, not tests"
