"""Documents: read, recognise, extract, chunk, index and summarize; and search.

The functions here are the steps of the `ingest_document` pipeline (declared
in idemops_demo/tools/documents.py) and the queries of its read tools. Each step
is deterministic in its inputs, so a step that runs again after a crash
produces the same output, and a resumed ingest ends exactly like an
uninterrupted one. `sources.py` reads the bytes (inline, or a path or URL on
the allow-lists), `extraction.py` recognises the format and extracts text,
`index.py` chunks, indexes, embeds and summarizes, `embeddings.py` turns
text into vectors with a model shipped in its wheel, `search.py` searches by
words, by meaning or both, and `vector_extension.py` checks the server has
pgvector.

May import: core.
"""

from idemops_demo.documents.embeddings import MODEL_NAME as EMBEDDING_MODEL
from idemops_demo.documents.extraction import (
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
from idemops_demo.documents.index import (
    INDEX_BATCH,
    SUMMARY_SENTENCES,
    TITLE_MAX,
    chunk,
    embed_chunks,
    get_for_tenant,
    index,
    mark_ready,
    purge_documents,
    summarize,
    text_of,
)
from idemops_demo.documents.models import Document, DocumentChunk
from idemops_demo.documents.search import MODES, search
from idemops_demo.documents.sources import (
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
from idemops_demo.documents.vector_extension import MissingExtension, check_pgvector

__all__ = [
    "Document", "DocumentChunk", "EMBEDDING_MODEL", "FORMATS", "INDEX_BATCH", "MODES", "MissingExtension",
    "NoTextLayer", "Progress", "READ_BLOCK", "SUMMARY_SENTENCES", "TITLE_MAX", "allowed_path", "allowed_url",
    "check_pgvector", "chunk", "decode_base64", "decode_text", "detect_format", "embed_chunks", "extract",
    "extract_html", "extract_markdown", "extract_pdf", "fetch_url", "get_for_tenant", "index", "is_pdf", "mark_ready",
    "max_bytes", "no_progress", "purge_documents", "read_path", "search", "sha256", "summarize", "text_of", "tidy",
]
