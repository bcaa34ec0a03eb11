"""Plain Django HTTP entry points: the probes (`/livez`, `/readyz`, `/healthz`), `/metrics`
(Prometheus), and the middleware
that answers a database outage with 503 + Retry-After (the admin, the API and every other Django
view), and the one that tells when a session last entered a second-factor code (`second_factor.py`).

May import: everything below the entry points.
"""
