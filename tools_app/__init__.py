"""idemops' Django app: one package per concept. docs/architecture.md shows the layers.

The layers, top to bottom (pyproject.toml's import contract; a test holds this table to it).
`scheduling` is agents' and operators' scheduled tool calls; `schedules` the platform's own periodic jobs.

    apps                                   wiring: the app's start-up (hooks, signals)
    schedules | models | migrations        periodic jobs, the models Django loads, the schema
    mcp | api | admin | web | management   entry points
    tools                                  the platform's own tools
    metrics | retention | bulk             figures, keeping and purging, recovery by filter
    approvals | reconciliation | tasks | scheduling   approvals, unknown outcomes, long tasks, scheduled calls
    toolkit | outbox                       what a tool author imports; messages sent after commit
    incidents                              breakers, pauses, in-flight limits per downstream
    engine | access                        claim, execute, follow, record transitions | tenants, tokens, roles
    core                                   errors, keys, fingerprints, db helpers, audit, leases, jobs, logs
    conf                                   the settings object (`conf()`), read once from the environment

A package imports only from the lines below it (and its own modules); the
import contract in `make lint` keeps it so. Nothing here imports `idemops` (the public API's
face, which imports all of this), but `serve` the embedded PostgreSQL server (idemops.embedded_pg).
"""

import importlib
from types import ModuleType

# Paths that django-q2 jobs queued (or schedules saved) before the packages moved
# may still hold: `tools_app.task_runner.run_task` and `tools_app.audit.seal_periodically`
# name modules that moved. django-q2 resolves a path with pydoc.locate, which falls
# back to attributes, so these names keep the old paths resolving. (The other old
# paths, e.g. `tools_app.approvals.run_approved`, are names the packages export.)
_MOVED_MODULES = {"task_runner": "tools_app.tasks.jobs", "audit": "tools_app.core.jobs"}


def __getattr__(name: str) -> ModuleType:
    if name in _MOVED_MODULES:
        return importlib.import_module(_MOVED_MODULES[name])
    raise AttributeError(f"module 'tools_app' has no attribute {name!r}")
