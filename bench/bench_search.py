"""Issue 13: the embed step's throughput and search latency per mode (keyword, semantic, hybrid).

A synthetic corpus (tests' deterministic prose) is chunked, indexed and embedded
in-process with the functions the ingest_document steps call (index, then
embed_chunks in batches of IDEMOPS_DOCUMENT_EMBED_BATCH), then queried in each
mode. The semantic and hybrid figures include embedding the query (one text,
the model already loaded).

    make bench  (or: .venv/bin/python bench/run.py search)
"""

from __future__ import annotations

import time
import uuid

from bench.common import row, summary, timed

QUERIES = ["customs tariff for a delayed container", "who pays the surcharge on late freight",
           "harbor pilot schedule", "refund of a rebate after the audit", "forklift at the dock"]


def run(quick: bool = False) -> str:
    from django.utils import timezone

    from idemops_demo import documents
    from idemops_demo.idemops_settings import DemoSettings
    from tests.support.documents_fixtures import long_text
    from tools_app import access
    from tools_app.engine.models import IdempotencyRecord
    from tools_app.tasks.models import Task

    characters = 200_000 if quick else 2_000_000
    tenant = access.create_tenant(f"bench-search-{uuid.uuid4().hex[:6]}")
    now = timezone.now()
    record = IdempotencyRecord.objects.create(
        tenant=tenant, tool="ingest_document", key=f"bench-{uuid.uuid4().hex}", fingerprint="0" * 64,
        operation_id=uuid.uuid4(), created_at=now, updated_at=now, expires_at=now)
    task = Task.objects.create(tenant=tenant, tool="ingest_document", record=record, arguments={},
                               input_digest="0" * 64, steps_total=7, max_attempts=1, created_at=now, updated_at=now)
    text = long_text(characters)
    chunks = documents.chunk(text, DemoSettings.current().document_chunk_chars)
    document = documents.index(tenant_id=tenant.pk, task_id=task.pk, title="bench", fmt="text", source="upload",
                               content_sha256="0" * 64, text=text, chunks=chunks)
    documents.embeddings.embed_one("warm up")  # the model loads once per process; not part of the step's rate
    started = time.perf_counter()
    documents.embed_chunks(document.pk, batch=DemoSettings.current().document_embed_batch)
    embed_seconds = time.perf_counter() - started
    documents.mark_ready(document.pk, "bench")

    count = 20 if quick else 100
    lines = [
        "## Semantic search (issue 13)", "",
        f"One document of {len(text):,} characters in {len(chunks):,} chunks of at most "
        f"{DemoSettings.current().document_chunk_chars} characters. Embedding (model "
        f"`{documents.EMBEDDING_MODEL}`, batches of {DemoSettings.current().document_embed_batch}, each written in "
        f"its own transaction): {embed_seconds:.2f} s, "
        f"**{len(chunks) / embed_seconds:,.0f} chunks/s**.", "",
        f"search_documents, {count} queries per mode, limit 10 (semantic and hybrid include embedding the query):",
        "", "| Mode | median ms | p99 ms | queries/s |", "| --- | --- | --- | --- |",
    ]
    for mode in documents.MODES:
        stats = summary(timed(lambda i, mode=mode: documents.search(tenant.pk, QUERIES[i % len(QUERIES)], 10, mode),
                              count))
        lines.append(row(mode, stats))
    return "\n".join(lines) + "\n"
