"""The client installs on its own: `pip install ./idemops_client` into a fresh virtual environment.

A real install with pip as this machine is set up (it reaches the package
registries), dependencies included, from a copy of the package directory
(building in place would leave build/ and *.egg-info behind). Then, from
outside the repository: the package imports from the venv, declares `mcp`
as its only dependency (the framework adapters are extras), ships py.typed, and
the `idemops-client` command (the proxy for MCP hosts) and the demo's entry point run.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.processes import ROOT

CHECK = """
import importlib.metadata, json, pathlib
import idemops_client
from idemops_client import IdempotentClient, Ledger
requires = importlib.metadata.requires("idemops-client")
print(json.dumps({"file": idemops_client.__file__, "requires": [r for r in requires if "extra ==" not in r],
                  "extras": sorted(importlib.metadata.metadata("idemops-client").get_all("Provides-Extra")),
                  "typed": (pathlib.Path(idemops_client.__file__).parent / "py.typed").is_file()}))
"""


def run(args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    completed = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                               env=env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


def test_pip_installs_the_client_on_its_own_into_a_fresh_venv(tmp_path):
    source = tmp_path / "src" / "idemops_client"
    shutil.copytree(ROOT / "idemops_client", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"

    run([python, "-m", "pip", "install", "--quiet", source], cwd=tmp_path, timeout=900)

    found = json.loads(run([python, "-c", CHECK], cwd=tmp_path).stdout)
    assert Path(found["file"]).is_relative_to(venv)
    assert found["requires"] == ["mcp<3,>=2.3"]
    assert found["extras"] == ["openai-agents", "pydantic-ai"] and found["typed"]
    run([python, "-m", "pip", "check"], cwd=tmp_path)
    proxy_help = run([venv / "bin" / "idemops-client", "proxy", "--help"], cwd=tmp_path).stdout
    assert "--url" in proxy_help and "--token" in proxy_help and "--ledger" in proxy_help
    demo_help = run([venv / "bin" / "idemops-client-demo", "--help"], cwd=tmp_path).stdout
    assert "--url" in demo_help and "--token" in demo_help
