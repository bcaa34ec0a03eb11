"""idemops' Django app: one package per concept. docs/architecture.md shows the layers.

    core                errors, keys and fingerprints, db helpers, audit, leases, jobs, hooks, logs, tracing, counters
    access | engine     tenants, tokens, roles, authorize | claim, execute, follow, record transitions
    toolkit             what a tool author imports: registry, policies, pipelines, calls
    approvals | reconciliation | outbox | tasks | documents
    scheduling          scheduled and delayed operations: a tool call at a time or on a cron rule, each
                        occurrence under its own key (not schedules.py: the platform's own periodic jobs)
    metrics             /metrics and the dashboard's figures, from the rows core.counters writes
    tools               the tools themselves (and their business models)
    mcp | api | admin | web | management      entry points
    apps, schedules, models                    wiring: hooks, periodic jobs, the models Django loads

A package imports only from the lines above it (and its own modules); an
import contract in `make lint` keeps it so.
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
