"""The ground floor: what every other package may use, and which imports none of them.

- `errors.py`: the error classes an agent can act on (ToolFailure and its kinds).
- `keys.py`: idempotency keys, canonical JSON and fingerprints, keyed digests.
- `db.py`: SQL the ORM cannot say; `transition`, the one guarded state change (a conditional
  UPDATE and its audit event in one statement).
- `audit.py` and `models.py`: the append-only audit log and its hash chain.
- `leases.py`: lease owners, lease expiries and the heartbeat that renews a lease.
- `backoff.py`: the one backoff formula (exponential, equal jitter) of every retry.
- `polling.py`: waiting a bounded time for another process, with a growing pause.
- `jobs.py`: every django-q2 job by name, and `enqueue`.
- `hooks.py`: how a lower package calls into a higher one without importing it.
- `outage.py`: what an entry point answers while the database is unreachable.
- `redaction.py`: what may be shown, stored or exported of callers' data.
- `url_allowlist.py`: outbound URLs that cannot escape their allow-list.
- `crashpoints.py`: crash points that tests arm to kill a process at a chosen line.
- `logs.py`: structured log lines (context, trace ids, redaction, JSON or text) from every process.
- `tracing.py`: OpenTelemetry: spans, the trace ids rows keep, traced outbound HTTP requests.
- `counters.py`: what the platform counts, written about once a second to the per-minute rows
  and the running totals (`models.py`: MetricMinute, MetricTotal) that tools_app.metrics reads.

May import: Django, libraries and the settings object (`tools_app.conf.conf()`) only.
"""
