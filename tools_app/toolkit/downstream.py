"""Calling a downstream system over HTTP, with every failure classified where it happens.

- the request never left (connection refused, pool timeout) → `Transient`, whose
  `retry_after` the engine sets from the attempt count (core.backoff);
- 429 and 503 → `Transient` with the server's Retry-After (without one: as above);
- other 4xx → deterministic (`InvalidInput`, `DownstreamConflict` for 409,
  `PermissionDenied` for 401/403): replayed, never retried;
- it may have arrived (timeout after sending, broken connection, other 5xx)
  → `UnknownOutcome`: the record goes UNKNOWN and is reconciled.

Every answer is evidence kept on the record: what was asked, what came back,
when, and whether the downstream deduplicated our key (`Idempotent-Replayed`). An answer that
deduplicated our key, or a 409 refusing it reused, is counted
(`idemops_downstream_duplicates_total`). The request is traced (core.tracing: a CLIENT span,
and `traceparent` sent along).
"""

from __future__ import annotations

from typing import Any

import httpx2

from tools_app import incidents
from tools_app.core import backoff, counters, logs, tracing
from tools_app.core.errors import (
    UNKNOWN_OUTCOME_ADVICE,
    DownstreamConflict,
    InvalidInput,
    PermissionDenied,
    ToolFailure,
    Transient,
    UnknownOutcome,
)
from tools_app.engine import evidence_entry, note_evidence
from tools_app.toolkit.registry import find_tool


def request(method: str, url: str, *, timeout: float, json: Any = None, headers: dict[str, str] | None = None,
            asked: dict[str, Any] | None = None) -> httpx2.Response:
    """Send one request; return a 2xx response or raise a classified failure.

    `asked` is what the evidence records of the request (never secrets).
    """
    asked = {"method": method, "url": url, **(asked or {})}
    downstream = downstream_name(url)
    # Held back before anything leaves (a pause, an open breaker, every slot taken): a known non-execution.
    incidents.admit_request(downstream)
    try:
        with incidents.in_flight(downstream, seconds=timeout):
            response = tracing.request(method, url, json=json, headers=headers, timeout=timeout)
    except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
        incidents.record_failure(downstream, f"unreachable ({type(exc).__name__})")
        raise Transient(f"the downstream system is unreachable ({type(exc).__name__}); retry with the same key",
                        evidence=evidence_entry("executor", asked=asked, error=type(exc).__name__)) from exc
    except httpx2.TransportError as exc:
        incidents.record_failure(downstream, f"no answer ({type(exc).__name__})")
        raise UnknownOutcome(
            f"the downstream request was sent but no answer came back ({type(exc).__name__}); its outcome is being "
            f"reconciled: {UNKNOWN_OUTCOME_ADVICE}",
            evidence=evidence_entry("executor", asked=asked, error=type(exc).__name__)) from exc
    # The downstream recognised our key and returned its earlier result instead of acting again,
    # or refused it because it holds it for another request.
    deduplicated = response.is_success and response.headers.get("idempotent-replayed", "").lower() == "true"
    if deduplicated or response.status_code == 409:
        context = logs.context()
        counters.count(counters.DOWNSTREAM_DUPLICATE, tool=context.get("tool", ""), tenant_id=context.get("tenant_id"))
    if response.status_code in (429, 503) or response.status_code >= 500:
        incidents.record_failure(downstream, f"answered {response.status_code}")
    else:
        incidents.record_success(downstream)
    if response.is_success:
        note_evidence(evidence_entry("executor", asked=asked, answer={
            "status": response.status_code, "deduplicated": deduplicated}))
        return response
    raise classify(response, asked)


def downstream_name(url: str) -> str:
    """The downstream system a request of the call being worked on goes to: the name its tool
    declared (ToolSpec.downstream), else the URL's host (then learned for the tool, so its next
    calls are held back before they run, as a declared one's are)."""
    tool = logs.context().get("tool", "")
    spec = find_tool(tool)
    if spec is not None and spec.downstream:
        return spec.downstream
    host = httpx2.URL(url).host or url
    if tool:
        incidents.learn(tool, host)
    return host


def classify(response: httpx2.Response, asked: dict[str, Any]) -> ToolFailure:
    status = response.status_code
    answer = {"status": status, "body": response.text[:500]}
    evidence = evidence_entry("executor", asked=asked, answer=answer)
    if status in (429, 503):
        retry_after = backoff.retry_after_header(response.headers.get("retry-after"))
        after = "retry_after seconds" if retry_after is None else f"{retry_after:g}s"
        return Transient(f"the downstream system asked us to slow down ({status}); retry with the same key after "
                         f"{after}", retry_after=retry_after, evidence=evidence)
    if status == 409:
        return DownstreamConflict(
            f"the downstream system already holds this operation's key for a different request "
            f"({_message(response)}); an operator must check what it did. Do not retry with this key, and do not "
            "just use a new key: the earlier request may be this same operation, already done",
            evidence=evidence)
    if status in (401, 403):
        return PermissionDenied(f"the downstream system refused the request ({status})", evidence=evidence)
    if 400 <= status < 500:
        return InvalidInput(f"the downstream system rejected the request ({status}): {_message(response)}",
                            evidence=evidence)
    return UnknownOutcome(f"the downstream system failed ({status}) after receiving the request; its outcome is "
                          f"being reconciled: {UNKNOWN_OUTCOME_ADVICE}", evidence=evidence)


def _message(response: httpx2.Response) -> str:
    try:
        return str(response.json().get("error", ""))[:200]
    except ValueError:
        return response.text[:200]
