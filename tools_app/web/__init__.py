"""Plain Django HTTP entry points: the probes (`/livez`, `/readyz`, `/healthz`), `/metrics`
(Prometheus), and the middleware
that answers a database outage with 503 + Retry-After (the admin, the API and every other Django
view).

May import: everything below the entry points.
"""
