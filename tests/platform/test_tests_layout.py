"""The suite's layout, one rule: test folders beside the helpers' one folder, tests/support/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_helper_module_sits_flat_in_tests_every_helper_is_in_tests_support():
    flat = sorted(p.name for p in TESTS.glob("*.py") if p.name not in ("__init__.py", "conftest.py"))
    assert flat == [], f"helpers belong in tests/support/: {flat}"
    assert (TESTS / "support" / "__init__.py").read_text().startswith('"""')
    assert not list((TESTS / "support").glob("test_*.py")), "tests/support holds helpers, not tests"


# The folders that test no one package, and what each holds instead.
ACROSS_PACKAGES = {
    "demo": "the demo app (idemops_demo) as an adopter's app, through the public API",
    "client": "the client distribution (idemops_client)",
    "conformance": "the idempotency extension's conformance suite (conformance) and the official one",
    "interop": "other MCP SDKs and hosts (TypeScript, the Inspector) against the server",
    "deploy": "install, settings, serve, production mode, the docs followed word for word, benchmarks' quick run",
    "platform": "the public API, the import layers, packaging, the suite's own layout",
    "observability": "metrics, logs, traces and health, end to end across packages",
    "support": "helpers, not tests",
}


def test_each_test_folder_is_named_after_the_package_it_tests_or_says_what_it_spans():
    packages = {p.name for p in (TESTS.parent / "tools_app").iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    unnamed = sorted(folders - packages - ACROSS_PACKAGES.keys())
    assert unnamed == [], f"name these after the tools_app package they test, or say what they span: {unnamed}"
    assert not ACROSS_PACKAGES.keys() & packages, "a folder named after a package tests that package"
