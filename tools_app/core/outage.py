"""When the database is unreachable: what every entry point answers instead of a traceback.

PostgreSQL restarting (a failover, an upgrade, a crash) makes queries fail with
`OperationalError` or `InterfaceError` for a few seconds. Every entry point answers that as
"unavailable: come back after Retry-After", in its own format, from the pieces here:

- the admin, the API and the other Django views: HTTP 503 with Retry-After
  (web.unavailable.DatabaseUnavailableMiddleware), JSON, or a short page for the admin;
- `/healthz`: 503 with Retry-After and the failed check (web.health);
- `/mcp`: 503 with Retry-After and a JSON-RPC error when the bearer token cannot be checked
  (mcp.guards.DatabaseGuard); a tool call that reached the engine answers an `isError` result
  of class `transient` with `retry_after` (mcp.runtime).

Nothing here reconnects: connections are persistent and health-checked (CONN_MAX_AGE, Django's
connection health checks), so the first request after the restart gets a fresh one.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.db import InterfaceError, OperationalError

from tools_app.conf import conf
from tools_app.core.errors import Transient

logger = logging.getLogger(__name__)


DATABASE_ERRORS = (OperationalError, InterfaceError)


MESSAGE = ("the database is unavailable for a moment; retry after retry_after seconds "
           "(a write with the same idempotency_key: it runs at most once)")


def retry_after() -> float:
    return conf().unavailable_retry_after_seconds


def retry_after_header() -> str:
    """Retry-After takes whole seconds."""
    return str(max(1, math.ceil(retry_after())))


def transient() -> Transient:
    """The tool error for a call the outage interrupted."""
    return Transient(MESSAGE, retry_after=retry_after())


def error_body() -> dict[str, Any]:
    """The `error` object of a JSON answer, shaped like a tool call's error."""
    return {"class": "transient", "message": MESSAGE, "retry_after": retry_after()}


def log(where: str, exc: BaseException) -> None:
    # A warning, not a traceback per request: during an outage there are many.
    logger.warning("%s: database unavailable (%s: %s)", where, type(exc).__name__, str(exc).strip()[:200])
