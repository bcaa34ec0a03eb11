"""The web process as its ASGI server loads it (idemops.asgi)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import ROOT, child_env

LOADED = """
import gc, json
import idemops.asgi
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def test_what_start_up_built_is_kept_out_of_the_collectors_walks(transactional_db):
    """Start-up's objects (Django, the SDK, the tools) live as long as the process: frozen (gc.freeze), a
    full collection walks only what requests allocated since, not all of them each time."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["frozen"] > 100_000 and counts["tracked"] < counts["frozen"] / 100
