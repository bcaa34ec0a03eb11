"""Incidents: what keeps a downstream outage from turning into work for a person.

- `breaker.py`: a circuit breaker per downstream system, its state in PostgreSQL (the Downstream
  row) so every web process and job worker sees one breaker. Repeated definite failures or
  timeouts within a window open it; while open, calls to that downstream's tools answer
  `transient` with `retry_after` set to its next probe, without running and without counting a
  run; one probe at a time closes it on success.
- `pauses.py`: an operator pauses a tool, a downstream or one tenant's writes (and resumes):
  meanwhile calls answer `transient` with retry_after and the operator's reason.
- `limits.py`: a limit on calls in flight per downstream, shared across processes (leased slots),
  so the retries and the reconciler's lookups after a recovery do not knock it over again; and the
  same leased slots hold one operation at a time per business entity (a tool's concurrency_key).
- `gate.py`: the one question asked before a write runs (engine.Operation.admit): may it run now?
  Answered from a snapshot of the pauses and breakers each process re-reads at most every
  IDEMOPS_INCIDENT_STATE_SECONDS, so the hot path asks the database nothing new.

Why not pybreaker or purgatory: both keep a breaker's state in one process (pybreaker can use
Redis); idemops' processes share PostgreSQL and nothing else, and a breaker that each web process
and worker opened on its own would let every one of them hammer a failing downstream.

May import: tools_app.core and tools_app.access (the tenant, permits). The engine learns of it only
through Operation.admit; toolkit (downstream requests, calls), reconciliation and tasks use it.
"""

from tools_app.incidents.breaker import record_failure, record_success
from tools_app.incidents.gate import admission, admit, admit_request
from tools_app.incidents.limits import Full, entity_slot_name, in_flight, one_at_a_time
from tools_app.incidents.models import BreakerState, Downstream, Pause, PauseScope
from tools_app.incidents.pauses import PAUSE, pause, resume
from tools_app.incidents.state import breaker_open, downstream_of, learn, snapshot

__all__ = ["PAUSE", "BreakerState", "breaker_open", "Downstream", "Full", "Pause", "PauseScope", "admission", "admit",
           "admit_request", "downstream_of", "entity_slot_name", "in_flight", "learn", "one_at_a_time", "pause",
           "record_failure", "record_success", "resume", "snapshot"]
