"""CSV exports that stream: constant memory however many rows are exported.

Rows come from a queryset's `.iterator(chunk_size=...)` (a server-side cursor
on PostgreSQL), are written into a small buffer and leave it in ~64 KiB
chunks, so neither the rows nor the file are ever held whole. Columns are
fixed by the caller (the endpoint's serializer fields, in declared order), and
the first line is always the header.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Generator, Iterable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

CHUNK_BYTES = 64 * 1024
ROWS_PER_FETCH = 2000
CONTENT_TYPE = "text/csv; charset=utf-8"
# A cell starting with one of these is a formula to spreadsheet programs
# (CSV injection): an auditor opening the file must not run an actor's text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> str:
    """One value as CSV text: lists joined by ';', objects as sorted JSON, formulas defused."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        text = ";".join(cell(v) for v in value)
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    else:
        text = str(value)
    if text.startswith(FORMULA_STARTS):
        return "'" + text
    return text


def csv_chunks(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Generator[bytes]:
    """The header line, then the rows, as UTF-8 chunks of about CHUNK_BYTES."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # RFC 4180: CRLF line ends, quotes only where needed
    writer.writerow(header)
    for row in rows:
        writer.writerow([cell(value) for value in row])
        if buffer.tell() >= CHUNK_BYTES:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()


async def _in_request_thread(chunks: Generator[bytes]) -> AsyncIterator[bytes]:
    """Pull each chunk in the request's sync thread: the cursor and its connection live there."""
    take = sync_to_async(lambda: next(chunks, None), thread_sensitive=True)
    try:
        while (chunk := await take()) is not None:
            yield chunk
    finally:
        # The client may leave mid-export: close the server-side cursor in its own thread.
        await sync_to_async(chunks.close, thread_sensitive=True)()


def _primed(chunks: Generator[bytes]) -> Generator[bytes]:
    """Compute the first chunk now: it runs the query, so a query that fails is an
    ordinary error response instead of a 200 cut short after its headers."""
    first = next(chunks)

    def rest() -> Generator[bytes]:
        try:
            yield first
            yield from chunks
        finally:
            chunks.close()

    return rest()


def streaming_csv_response(request: HttpRequest, header: Sequence[str], rows: Iterable[Sequence[Any]],
                           filename: str) -> StreamingHttpResponse:
    chunks = _primed(csv_chunks(header, rows))
    # Under ASGI, Django would drain a sync iterator into a list before sending
    # it (django.http.StreamingHttpResponse.__aiter__): give it an async one.
    content = _in_request_thread(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response
