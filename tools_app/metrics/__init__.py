"""What the platform tells about itself, read from one source: the figures counted by every
process (tools_app.core.counters: per-minute rows and running totals) and what is stuck right
now (gauges read from the records, tasks, outbox events and approval requests).

- `prometheus.py`: `/metrics` in the Prometheus text format (tools_app.web serves it).
- `gauges.py`: the "now" figures, for `/metrics` and the dashboard alike.
- `rollup.py`: the per-minute rows, queried per tenant, tool and time step (`series`), and pruned.
- `dashboard.py`: the operators' dashboard's figures.
- `jobs.py`: the django-q2 job that prunes old per-minute rows.

May import: core, access, engine, toolkit, and the concepts' models (approvals, tasks, outbox)
for the figures it reads.
"""
