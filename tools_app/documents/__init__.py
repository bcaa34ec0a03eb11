"""Documents: read, recognise, extract, chunk, index and summarize; and search.

The functions here are the steps of the `ingest_document` pipeline (declared
in tools_app/tools/documents.py) and the queries of its read tools. Each step
is deterministic in its inputs, so a step that runs again after a crash
produces the same output, and a resumed ingest ends exactly like an
uninterrupted one. `sources.py` reads the bytes (inline, or a path or URL on
the allow-lists), `extraction.py` recognises the format and extracts text,
`index.py` chunks, indexes, summarizes and searches.

May import: core.
"""

from tools_app.documents.extraction import (
    FORMATS,
    NoTextLayer,
    decode_text,
    detect_format,
    extract,
    extract_html,
    extract_markdown,
    extract_pdf,
    is_pdf,
    tidy,
)
from tools_app.documents.index import (
    INDEX_BATCH,
    SUMMARY_SENTENCES,
    TITLE_MAX,
    chunk,
    get_for_tenant,
    index,
    mark_ready,
    search,
    summarize,
    text_of,
)
from tools_app.documents.sources import (
    READ_BLOCK,
    Progress,
    allowed_path,
    allowed_url,
    decode_base64,
    fetch_url,
    max_bytes,
    no_progress,
    read_path,
    sha256,
)

__all__ = [
    "FORMATS", "INDEX_BATCH", "NoTextLayer", "Progress", "READ_BLOCK", "SUMMARY_SENTENCES", "TITLE_MAX",
    "allowed_path", "allowed_url", "chunk", "decode_base64", "decode_text", "detect_format", "extract",
    "extract_html", "extract_markdown", "extract_pdf", "fetch_url", "get_for_tenant", "index", "is_pdf", "mark_ready",
    "max_bytes", "no_progress", "read_path", "search", "sha256", "summarize", "text_of", "tidy",
]
