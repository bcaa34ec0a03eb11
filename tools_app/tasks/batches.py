"""Steps that work in batches: each batch's effect and its record commit in one transaction.

`BatchStore` is what a step's `ctx.each_batch` calls (the runner builds one per
step). Before a batch runs, its record is looked up: one whose input digest
(the step's, the batch's position and items) and checksum still match is
reused, and the batch is not applied again. Otherwise the batch runs inside a
transaction that first renews the task's lease under a row lock (status
running, lease owner = this worker): a worker whose lease was taken (it was
presumed dead, or the task was cancelled) applies nothing, and a sweep that
would take the lease waits for the batch to commit. The batch's record is
written before the commit, so a crash anywhere loses the whole batch or none
of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from tools_app.core import leases
from tools_app.core.crashpoints import crash_point
from tools_app.tasks.checkpoints import serialize, sha256
from tools_app.tasks.models import StepBatch, Task, TaskStatus
from tools_app.tasks.state import lease_seconds
from tools_app.toolkit.pipelines import Interrupted

Progress = Callable[[float, float | None, str], None]


class BatchStore:
    def __init__(self, task: Task, owner: str, sequence: int, step_digest: str):
        self.task = task
        self.owner = owner
        self.sequence = sequence
        self.step_digest = step_digest

    def __call__(self, items: list[Any], size: int, apply: Callable[[list[Any]], Any],
                 progress: Progress) -> list[Any]:
        if size < 1:
            raise ValueError("a batch holds at least one item")
        batches = [items[start:start + size] for start in range(0, len(items), size)]
        recorded = {row.batch: row for row in StepBatch.objects.filter(task=self.task, sequence=self.sequence)}
        outputs = []
        for number, batch in enumerate(batches):
            digest = self._digest(number, batch)
            row = recorded.get(number)
            if row is not None and row.input_digest == digest and row.checksum == sha256(serialize(row.output)):
                outputs.append(row.output)
            else:
                outputs.append(self._apply(number, batch, digest, apply))
                crash_point("after_batch")
            progress(number + 1, len(batches), f"batch {number + 1}/{len(batches)}")
        return outputs

    def _digest(self, number: int, batch: list[Any]) -> str:
        return sha256(json.dumps([self.step_digest, number, batch], sort_keys=True, default=str).encode())

    def _apply(self, number: int, batch: list[Any], digest: str, apply: Callable[[list[Any]], Any]) -> Any:
        with transaction.atomic():
            # The row lock taken here is held until the batch commits: the lease cannot change hands
            # (a sweep's expire_lease, a cancel) in the middle of a batch.
            held = Task.objects.filter(pk=self.task.pk, status=TaskStatus.RUNNING, lease_owner=self.owner).update(
                lease_expires_at=leases.expiry(lease_seconds()))
            if not held:
                raise Interrupted("the task was cancelled or its lease was lost")
            output = json.loads(serialize(apply(batch)))
            fields = {"input_digest": digest, "output": output, "checksum": sha256(serialize(output)),
                      "finished_at": timezone.now()}
            StepBatch.objects.update_or_create(task=self.task, sequence=self.sequence, batch=number,
                                               defaults=fields)
        return output
