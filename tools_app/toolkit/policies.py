"""Policies a tool declares, as a tool author writes them: how to find out what became of a
downstream call (reconciler answers), and what a sensitive call needs before it runs (ApprovalPolicy).

The packages that act on them (reconciliation, approvals) read these types; a tool module needs
nothing else from those packages to declare its policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from tools_app.engine import evidence_entry

# --- reconciliation: what a reconciler (SentCall) -> Answer found downstream ---------------------


@dataclass
class Found:
    result: dict[str, Any]
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class NotDone:
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class StillUnknown:
    evidence: dict[str, Any] = field(default_factory=dict)


Answer = Found | NotDone | StillUnknown


def nothing_committed(call: object) -> NotDone:
    """The reconciler of every transactional tool: its effect commits with the
    record, so a record that never reached SUCCEEDED did nothing."""
    return NotDone("the local transaction never committed",
                   evidence_entry("reconciler", note="transactional tool: no committed effect"))


# --- approvals: what a sensitive call needs (ToolSpec.approval returns it, or None to run at once) ---


@dataclass(frozen=True)
class ApprovalPolicy:
    """What a sensitive call needs before it runs."""

    summary: str  # shown to the operator: what will happen, to what, for how much
    approvals_required: int = 1
    amount: Decimal | None = None
    currency: str = ""
    ttl: timedelta | None = None  # None: the tenant's request_ttl_minutes


# --- confirmation: what the person behind the agent confirms (ToolSpec.confirmation returns it, or None) ---


@dataclass(frozen=True)
class ConfirmationPolicy:
    """The person in front of the agent confirms this call, through their MCP host, before it runs.

    `summary` is shown to that person: what will happen, naming only what they sent (no other
    personal data: the host shows it, and it is kept in the audit log).
    """

    summary: str
    ttl: timedelta = timedelta(minutes=10)  # how long the question stands


# --- retention: how long what a tool's calls leave behind is kept (tools_app.retention purges it) ---


@dataclass(frozen=True)
class KeepFor:
    """How long a tool's data is kept once finished; None: the IDEMOPS_RETENTION_<KIND>_HOURS default.

    records: a finished idempotency record's arguments and result (never less than the key's
    retention: a replay needs them); tasks: a finished task's arguments, result and answers;
    artifacts: its checkpoints, step batches and artifacts; `kinds`: the periods of an app's own
    retention kinds (register_retained), by kind, e.g. `{"documents": timedelta(days=30)}`. A tenant's
    RetentionOverride wins over these.
    """

    records: timedelta | None = None
    tasks: timedelta | None = None
    artifacts: timedelta | None = None
    kinds: Mapping[str, timedelta] = field(default_factory=dict, hash=False)

    def period(self, kind: str) -> timedelta | None:
        """The declared period of `kind` (the platform's or an app's), or None."""
        if kind in ("records", "tasks", "artifacts"):
            declared: timedelta | None = getattr(self, kind)
            return declared
        return self.kinds.get(kind)


# Every retention at its setting's default (a declaration that says nothing of `keep`).
KEEP_DEFAULTS = KeepFor()
