"""Pipeline versions and deploys: a deploy never changes a running task silently.

A task keeps the pipeline version it started with (Task.pipeline_version, from Pipeline.version).
A worker runs it on that version's pipeline (Pipeline.for_version: the current one, one whose steps
also run it through patch markers, or an older one kept whole in `previous`), compensations and all.
Code that can run none of them does not start: the system check below (run by `manage.py qcluster`,
`manage.py serve` and every other management command) and the web application's start-up
(idemops.asgi) refuse, naming the unfinished tasks of the versions it would drop. (A worker of such
a deploy started anyway, e.g. with --skip-checks, leaves them alone: tools_app.tasks.runner holds them.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.core import checks
from django.db import transaction

from tools_app.core.errors import NotFound
from tools_app.tasks.models import Task
from tools_app.tasks.state import ACTIVE
from tools_app.toolkit.registry import get_tool

logger = logging.getLogger(__name__)

CHECK_ID = "idemops.E042"
NAMED = 10  # task ids named per version in a refusal


@dataclass(frozen=True)
class Stranded:
    """Unfinished tasks of a pipeline version this code cannot run."""

    tool: str
    version: int
    runs: tuple[int, ...]
    task_ids: tuple[str, ...]  # up to NAMED of them
    count: int

    def message(self) -> str:
        named = ", ".join(self.task_ids) + (f" and {self.count - len(self.task_ids)} more"
                                            if self.count > len(self.task_ids) else "")
        return (f"{self.count} unfinished task(s) of {self.tool!r} started on pipeline version {self.version}, "
                f"which this code cannot run (it runs versions {', '.join(map(str, self.runs))}): {named}")


def stranded() -> list[Stranded]:
    """The unfinished tasks, by tool and version, that this code's pipelines cannot run (tools not
    declared here are left out: another deployment's)."""
    found: list[Stranded] = []
    pairs = (Task.objects.filter(status__in=ACTIVE).values_list("tool", "pipeline_version").distinct()
             .order_by("tool", "pipeline_version"))
    for tool, version in pairs:
        try:
            pipeline = get_tool(tool).pipeline
        except NotFound:
            continue
        if pipeline is None or pipeline.for_version(version) is not None:
            continue
        tasks = Task.objects.filter(status__in=ACTIVE, tool=tool, pipeline_version=version)
        ids = tuple(str(pk) for pk in tasks.order_by("created_at", "pk").values_list("pk", flat=True)[:NAMED])
        found.append(Stranded(tool, version, pipeline.versions(), ids, tasks.count()))
    return found


def refusals() -> list[str]:
    """What stops this code from starting, one line per stranded version; [] when the database cannot
    be read (not there yet, not migrated yet: there is nothing to strand)."""
    try:
        with transaction.atomic():  # a savepoint inside a caller's transaction
            return [s.message() for s in stranded()]
    except Exception as exc:  # no database to check is not this check's failure
        logger.debug("pipeline versions not checked: %s", exc)
        return []


HINT = ("Deploy code whose pipeline keeps those versions runnable (Pipeline.previous, or also_runs with "
        "ctx.patched), or let those tasks finish (or cancel them) first. See docs/tasks.md, \"Versions\".")


@checks.register("idemops")
def check_pipeline_versions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [checks.Error(line, hint=HINT, id=CHECK_ID) for line in refusals()]


class StrandedTasks(RuntimeError):
    """The web application refuses to start: unfinished tasks of versions this code cannot run."""


def refuse_stranded() -> None:
    """The web application's start-up check (idemops.asgi)."""
    lines = refusals()
    if lines:
        raise StrandedTasks("refusing to start: " + "; ".join(lines) + ". " + HINT)
