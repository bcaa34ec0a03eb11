"""Per-call counters for the dashboard, written in batches off the request path.

`record_call` appends to an in-process buffer; a daemon thread writes it with
one bulk INSERT a second. A replay stays a pure read. A crash loses at most
the last second of counts, which is acceptable for rates (the audit log, not
this, is the record of what happened).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from django.db import close_old_connections
from django.utils import timezone

from tools_app.metrics.models import CallEvent
from tools_app.toolkit.calls import CallOutcome

logger = logging.getLogger(__name__)
FLUSH_INTERVAL_SECONDS = 1.0

_buffer: list[CallEvent] = []
_lock = threading.Lock()
_flusher: threading.Thread | None = None


def record_call(*, tenant_id: int | None, tool: str, outcome: CallOutcome, error_class: str = "",
                latency_ms: float) -> None:
    event = CallEvent(tenant_id=tenant_id, tool=tool, outcome=outcome, error_class=error_class,
                      latency_ms=latency_ms, created_at=timezone.now())
    with _lock:
        _buffer.append(event)
    _ensure_flusher()


def flush() -> int:
    with _lock:
        events = _buffer[:]
        _buffer.clear()
    if events:
        CallEvent.objects.bulk_create(events)
    return len(events)


def _ensure_flusher() -> None:
    global _flusher
    if _flusher is not None:
        return
    with _lock:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, name="metrics-flusher", daemon=True)
            _flusher.start()
            atexit.register(_flush_quietly)


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_SECONDS)
        _flush_quietly()


def _flush_quietly() -> None:
    try:
        close_old_connections()
        flush()
    except Exception:  # metrics must never take the server down
        logger.exception("could not write call metrics")
