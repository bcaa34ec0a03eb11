"""The demo: an example app beside the platform, built only on the public tool API (`idemops.tools`).

Orders, tickets, announcements, payments (through the demo payment gateway), notifications,
deletion, documents with embeddings and search, the onboarding saga and the ticket batch: the
business models (`models.py`, `documents/models.py`), their tools (`tools/`, found through
`idemops_tools.py`), their console pages (`admin.py`), the gateway's callback (`idemops_urls.py`)
and the demo downstream systems (`downstream/`, run by `manage.py serve`). On with IDEMOPS_DEMO
(the default outside production); with it off, no demo tool is listed and no demo table is made.

May import: `idemops.tools` and `idemops.conf` only (the import contract in pyproject.toml), so it
shows that the public API is enough to build on.
"""
