"""Fault injection for crash tests: a process dies (SIGKILL) at a named point.

Off unless the environment variable IDEMOPS_CRASH_POINTS lists points
(comma-separated). The crash tests start a real web process with it set, so
the process is killed exactly between two steps of the engine, the way a
power cut or an OOM kill would do it, and then check that nothing was
duplicated or lost.
"""

import os
import signal

# after_claim: the record is PROCESSING, nothing was sent downstream.
# after_downstream: the handler returned (a downstream call answered), nothing recorded yet.
# after_commit: the record is SUCCEEDED, the caller has no answer yet.
POINTS = frozenset({"after_claim", "after_downstream", "after_commit"})
_armed = frozenset(p.strip() for p in os.environ.get("IDEMOPS_CRASH_POINTS", "").split(",") if p.strip())
if unknown := _armed - POINTS:
    raise RuntimeError(f"unknown crash points {sorted(unknown)}; known: {sorted(POINTS)}")


def crash_point(name: str) -> None:
    if name in _armed:
        os.kill(os.getpid(), signal.SIGKILL)
