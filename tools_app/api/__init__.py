"""The auditors' read-only REST API (/api/v1/), its schema and docs (/api/schema/, /api/docs/).

`endpoints.AuditorViewSet` does the work every endpoint shares (auth, tenant
scoping, filters, cursor pages, streamed CSV, error documentation); each
endpoint module declares a serializer, a filterset and a viewset, and
`urls.py` registers it.

Read-only and thin. May import: every package below the entry points.
"""
