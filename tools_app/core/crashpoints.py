"""Fault injection for crash tests: a process dies (SIGKILL) at a named point.

Off unless the environment variable IDEMOPS_CRASH_POINTS lists points
(comma-separated). The crash tests start a real web process with it set, so
the process is killed exactly between two steps of the engine, the way a
power cut or an OOM kill would do it, and then check that nothing was
duplicated or lost.
"""

import os
import signal
import typing

from tools_app.conf import CrashPoint, conf

# after_claim: the record is PROCESSING, nothing was sent downstream.
# after_downstream: the handler returned (a downstream call answered), nothing recorded yet.
# after_commit: the record is SUCCEEDED, the caller has no answer yet.
# after_checkpoint: a task's step is checkpointed, the next step has not started (the task runner).
# after_batch: a batch inside a step committed (embeddings, a chunk of tickets), the next has not begun.
# in_compensation: a saga's compensation did its effect, its checkpoint is not written.
# (An unknown name in IDEMOPS_CRASH_POINTS stops start-up: tools_app/conf/fields.py.)
POINTS = frozenset(typing.get_args(CrashPoint))


def crash_point(name: CrashPoint) -> None:
    if name in conf().crash_points:
        os.kill(os.getpid(), signal.SIGKILL)
