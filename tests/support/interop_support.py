"""The TypeScript MCP clients the tests drive (tests/interop/): `make test` installs their npm packages
(npm ci), and so does `installed()` when they are missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import ROOT

INTEROP = ROOT / "tests" / "interop"


def installed() -> Path:
    """tests/interop with @modelcontextprotocol/sdk installed."""
    if not (INTEROP / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=INTEROP, check=True, timeout=600)
    return INTEROP
