"""The ledger as a short text an agent loop puts into the model's context.

One line per operation:

    create_order(customer=ACME, currency=EUR, 3 items) → done, order 17 (key ik-3f9a2b0c…)

Never the token; keys abbreviated; arguments whose names suggest a secret
are masked; long strings are cut.
"""

from __future__ import annotations

import re
from typing import Any

from idemops_client.entries import Entry, State

SECRET_NAME = re.compile(r"pass(word)?|secret|token|api_?key|credential|authorization", re.IGNORECASE)
MAX_ARGUMENTS = 4
MAX_STRING = 32

HEADER = ("Tool calls in this session (an identical call is answered from this list without running again; "
          "'unknown' and 'in progress' ones are asked about again with the same key, never re-done with new ones):")

_STATE_TEXT = {
    State.SUBMITTED: "submitted, no result yet",
    State.IN_PROGRESS: "in progress",
    State.PENDING_APPROVAL: "pending approval by a person",
    State.UNKNOWN: "unknown (may have happened; being checked)",
}


def render(entries: list[Entry], limit: int = 20) -> str:
    if not entries:
        return "No tool calls with side effects in this session yet."
    shown = entries[-limit:]
    lines = [HEADER]
    if len(entries) > len(shown):
        lines.append(f"({len(entries) - len(shown)} earlier calls not shown)")
    lines += [f"- {line(entry)}" for entry in shown]
    return "\n".join(lines)


def line(entry: Entry) -> str:
    return f"{entry.tool}({arguments_text(entry.arguments)}) → {outcome_text(entry)} (key {abbreviate(entry.key)})"


def abbreviate(key: str) -> str:
    return key if len(key) <= 12 else key[:11] + "…"


def arguments_text(arguments: dict[str, Any]) -> str:
    parts = []
    for name, value in list(arguments.items())[:MAX_ARGUMENTS]:
        if SECRET_NAME.search(name):
            parts.append(f"{name}=***")
        elif isinstance(value, list):
            parts.append(f"{len(value)} {name[:-1] if len(value) == 1 and name.endswith('s') else name}")
        elif isinstance(value, dict):
            parts.append(f"{name}={{…}}" if value else f"{name}={{}}")
        else:
            parts.append(f"{name}={_scalar(value)}")
    if len(arguments) > MAX_ARGUMENTS:
        parts.append("…")
    return ", ".join(parts)


def _scalar(value: Any) -> str:
    text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= MAX_STRING else text[:MAX_STRING - 1] + "…"


def outcome_text(entry: Entry) -> str:
    if entry.state == State.DONE:
        ids = result_ids(entry.result or {})
        return "done" + (f", {ids}" if ids else "")
    if entry.state == State.FAILED:
        error = entry.error or {}
        message = _scalar(error.get("message", ""))
        return f"failed: {error.get('class', 'error')}" + (f" ({message})" if message else "")
    if entry.state == State.SUBMITTED and entry.error:
        return f"{_STATE_TEXT[entry.state]} (last answer: {entry.error.get('class', 'error')})"
    return _STATE_TEXT[entry.state]


def result_ids(result: dict[str, Any]) -> str:
    """The result's identifiers ("order 17"), and its status if it has one."""
    parts = [f"{name.removesuffix('_id').replace('_', ' ')} {_scalar(value)}"
             for name, value in result.items() if name.endswith("_id") and value is not None and name != "operation_id"]
    if isinstance(result.get("status"), str):
        parts.append(f"status {result['status']}")
    return ", ".join(parts[:3])


_SECTIONS = (
    ("Done", (State.DONE,), "answered from the ledger if called again identically"),
    ("Unknown: may have happened", (State.UNKNOWN, State.SUBMITTED),
     "being checked; call again with exactly the same arguments to learn the outcome, never with new ones"),
    ("In progress", (State.IN_PROGRESS,), "still running; call again identically later for the result"),
    ("Waiting for a person", (State.PENDING_APPROVAL,), "needs approval; tell the user, do not work around it"),
    ("Failed", (State.FAILED,), "final for these arguments"),
)


def ledger_report(entries: list[Entry]) -> str:
    """The ledger grouped by what the model should do about each operation (the proxy's resource)."""
    lines = ["# Tool calls with side effects in this session", ""]
    if not entries:
        return "\n".join([*lines, "None yet."])
    for title, states, advice in _SECTIONS:
        chosen = [entry for entry in entries if entry.state in states]
        shown = [f"- {line(entry)}" for entry in chosen] or ["- none"]
        lines += [f"## {title} ({len(chosen)}): {advice}", *shown, ""]
    return "\n".join(lines).rstrip() + "\n"
