"""The built package, for the tests that install it as an adopter would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT


def run(args, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """A command outside this tree's virtualenv: no PYTHONPATH, no VIRTUAL_ENV, no settings module."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE") and not k.startswith("IDEMOPS_")}
    completed = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                               env={**base, **(env or {})})
    if check:
        assert completed.returncode == 0, f"{args}:\n{completed.stdout}\n{completed.stderr}"
    return completed


def database_url(name: str) -> str:
    """A postgresql:// URL (what DATABASE_URL takes) of database `name` on the test server."""
    from django.db import connection

    settings = connection.settings_dict
    return (f"postgresql://{settings['USER']}:{settings['PASSWORD'] or ''}@/{name}?host={settings['HOST']}"
            + (f"&port={settings['PORT']}" if settings["PORT"] else ""))


def interpreter(version: str) -> str | None:
    """A working `python<version>`: on PATH, or (pyenv's shims answer only for the selected versions)
    one of pyenv's installed versions; None if this machine has none."""
    candidates = [shutil.which(f"python{version}"),
                  *sorted(str(path) for path in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The idemops wheel built from this tree (`python -m build`), in a directory of its own."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source")
    # Build from a clean copy of the tree's tracked files: nothing the tests or make run left behind.
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "--null", "-T", "-", "-cf", "-"], cwd=ROOT, input=files, check=True,
                   stdout=open(source / "tree.tar", "wb"))
    subprocess.run(["tar", "-xf", "tree.tar"], cwd=source, check=True)
    (source / "tree.tar").unlink()
    run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", out, source], cwd=source, timeout=600)
    [built] = out.glob("idemops-*.whl")
    return built
