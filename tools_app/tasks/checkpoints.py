"""Checkpoints: a finished step's output, stored so a resumed task can skip the step.

An output is stored as its JSON bytes: inline in the Checkpoint when small, in
a TaskArtifact when large. Two digests make a checkpoint trustworthy:
- `checksum`, SHA-256 of the stored bytes: the output was not altered or
  truncated since it was written;
- `input_digest`, over the task's input digest, the step's name and version,
  and the checksums of the outputs before it: the step would read the same
  inputs today (a changed step version or an earlier output that was re-made
  differently invalidates it).
Resume walks the pipeline and reuses outputs up to the first step whose
checkpoint is missing or fails either check; that step and all after it run.
A saga that was compensating has a failure marker among its checkpoints: then
the walk follows the compensation plan (Pipeline.plan) instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from tools_app.core import audit, clock, db, instances, jsontext, personal
from tools_app.core.errors import NotFound
from tools_app.tasks.models import Checkpoint, Task, TaskArtifact
from tools_app.toolkit.pipelines import FAILED_PREFIX, Pipeline, Step

logger = logging.getLogger(__name__)

# Outputs up to this size stay in the checkpoint row; larger ones become artifacts.
INLINE_LIMIT = 16 * 1024


def serialize(output: Any) -> bytes:
    return _SORTED(output).encode()


# Sorted keys: the same output always has the same bytes, hence the same checksum.
_SORTED = jsontext.encoder(sort_keys=True, ensure_ascii=False, compact=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_digest(task: Task, step: Step, previous_checksums: list[str]) -> str:
    material = json.dumps([task.input_digest, step.name, step.version, previous_checksums])
    return sha256(material.encode())


@dataclass
class Prepared:
    """A step output ready to be written, computed before the write transaction."""

    step: Step
    sequence: int
    data: bytes
    checksum: str
    input_digest: str


def prepare(task: Task, step: Step, sequence: int, output: Any, previous_checksums: list[str]) -> Prepared:
    data = serialize(output)
    return Prepared(step=step, sequence=sequence, data=data, checksum=sha256(data),
                    input_digest=input_digest(task, step, previous_checksums))


@contextmanager
def writes(task: Task, prepared: Prepared) -> Iterator[tuple[db.Together, ...]]:
    """The checkpoint's writes, to go in the statement that advances the task (tasks.complete_step):
    its upsert (replacing an invalid one at the same position) and the removal of the artifact of
    the output it replaces. Use the statement inside the block: an output too large to stay inline
    is stored first as an artifact, in the block's transaction with the statement.
    """
    artifact = None
    inline = ""
    with transaction.atomic() if len(prepared.data) > INLINE_LIMIT else nullcontext():
        if len(prepared.data) > INLINE_LIMIT:
            artifact = TaskArtifact.objects.create(task=task, sha256=prepared.checksum, size=len(prepared.data),
                                                   data=prepared.data, created_at=timezone.now())
        else:
            # Its personal values encrypted (core.personal); the checksum stays the plain output's (stored_bytes).
            inline = prepared.data.decode()
            output = json.loads(inline)
            sealed = (personal.whole_for(output, task.tenant_id) if declares_personal(task.tool)
                      else personal.sealed_for(output, task.tenant_id))
            if sealed != output:
                inline = _SORTED(sealed)
        checkpoint = instances.unsaved(Checkpoint, {"task": task, "artifact": artifact}, sequence=prepared.sequence,
                                       step=prepared.step.name, input_digest=prepared.input_digest,
                                       output_inline=inline, checksum=prepared.checksum, finished_at=clock.NOW)
        yield (_upsert(checkpoint),
               # The artifact of an output this one replaces (an invalid checkpoint) is nobody's now: this
               # reads the checkpoint as it was before the statement.
               db.Together(f"DELETE FROM {db.table(TaskArtifact)} WHERE id = (SELECT artifact_id FROM "
                           f"{db.table(Checkpoint)} WHERE task_id = %s AND sequence = %s) "
                           "AND id IS DISTINCT FROM %s AND EXISTS (SELECT FROM changed)",
                           (task.pk, prepared.sequence, artifact.pk if artifact else None)))


def _upsert(checkpoint: Checkpoint) -> db.Together:
    columns, values, params, _ = db.insert_parts(checkpoint)
    updated = ", ".join(f"{column} = EXCLUDED.{column}" for column in columns)
    return db.Together(f"INSERT INTO {db.table(Checkpoint)} ({', '.join(columns)}) SELECT {', '.join(values)} "
                       f"FROM changed ON CONFLICT (task_id, sequence) DO UPDATE SET {updated}", params)


def declares_personal(tool: str) -> bool:
    """Whether `tool` declares personal arguments: its steps' outputs, derived from them, are personal too."""
    from tools_app.toolkit.registry import get_tool

    try:
        return bool(get_tool(tool).personal_fields)
    except NotFound:
        return True  # a tool no longer declared: kept as carefully as it may have needed


def stored_bytes(checkpoint: Checkpoint) -> bytes:
    if (artifact := checkpoint.artifact) is not None:
        return bytes(artifact.data)
    if personal.MARK in checkpoint.output_inline:  # the plain output's bytes, its envelopes opened
        return serialize(personal.opened(json.loads(checkpoint.output_inline)))
    return checkpoint.output_inline.encode()


@dataclass
class Resumption:
    """Where a task resumes: the outputs it may reuse (by step, in order) and the checksums they had."""

    outputs: dict[str, Any]
    checksums: list[str]
    plan: tuple[Step, ...] = ()
    failed_at: int | None = None  # a saga compensating: the step that failed for good

    @property
    def next_index(self) -> int:
        return len(self.checksums)


def valid_prefix(task: Task, pipeline: Pipeline, *, actor: str = audit.SYSTEM) -> Resumption:
    """Verify the task's checkpoints in order; stop at the first missing or invalid one.

    A task with no step done starts from its first step without reading: every checkpoint is written in
    the statement that names its step done (complete_step, begin_compensation; a fork copies both), and
    a run's first step keeps only the steps it verified, so a task that names none has none to reuse
    (a checkpoint rejected before stays rejected: its step runs again, as reading it would decide)."""
    if not task.completed_steps:
        return Resumption(outputs={}, checksums=[], plan=pipeline.steps)
    stored = {cp.sequence: cp for cp in Checkpoint.objects.filter(task=task).select_related("artifact")}
    failed_at = next((sequence for sequence, cp in sorted(stored.items()) if cp.step.startswith(FAILED_PREFIX)),
                     None)
    plan = pipeline.plan(failed_at if failed_at is not None and failed_at < len(pipeline.steps) else None)
    outputs: dict[str, Any] = {}
    checksums: list[str] = []
    for index, step in enumerate(plan):
        checkpoint = stored.get(index)
        if checkpoint is None:
            break
        problem = _problem(task, step, checkpoint, checksums)
        if problem:
            logger.warning("task %s: checkpoint of step %s is invalid (%s); it runs again", task.pk, step.name,
                           problem)
            audit.record_event(action="task.checkpoint_rejected", obj=task, actor=actor, trace_id=task.trace_id,
                               after={"step": step.name, "problem": problem})
            break
        outputs[step.name] = json.loads(stored_bytes(checkpoint))
        checksums.append(checkpoint.checksum)
    # A marker that did not verify leaves the forward plan: its step runs again.
    compensating = plan is not pipeline.steps and len(checksums) > (failed_at or 0)
    return Resumption(outputs=outputs, checksums=checksums, plan=plan if compensating else pipeline.steps,
                      failed_at=failed_at if compensating else None)


def _problem(task: Task, step: Step, checkpoint: Checkpoint, previous_checksums: list[str]) -> str:
    if checkpoint.step != step.name:
        return f"it belongs to step {checkpoint.step!r}"
    if sha256(stored_bytes(checkpoint)) != checkpoint.checksum:
        return "its output no longer matches its checksum"
    if checkpoint.input_digest != input_digest(task, step, previous_checksums):
        return "its inputs changed (arguments, step version or an earlier output)"
    return ""
