"""Chunks, the full-text index, the chunks' embeddings and summaries of documents; and reading them.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from idemops.tools import NotFound, crash_point
from idemops_demo.documents import embeddings
from idemops_demo.documents.models import Document, DocumentChunk
from idemops_demo.documents.sources import Progress, no_progress

INDEX_BATCH = 250


SUMMARY_SENTENCES = 5


TITLE_MAX = 300


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def chunk(text: str, size: int) -> list[str]:
    """Split into pieces of at most `size` characters, at paragraph, then sentence, then word breaks."""
    chunks: list[str] = []
    current = ""
    for piece in _pieces(text, size):
        if current and len(current) + 2 + len(piece) > size:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def _pieces(text: str, size: int) -> Iterator[str]:
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if len(paragraph) <= size:
            yield paragraph
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            while len(sentence) > size:
                cut = sentence.rfind(" ", 0, size)
                cut = cut if cut > size // 2 else size
                yield sentence[:cut].strip()
                sentence = sentence[cut:].strip()
            if sentence:
                yield sentence


def index(*, tenant_id: int, task_id: uuid.UUID, title: str, fmt: str, source: str, content_sha256: str, text: str,
          chunks: list[str], progress: Progress = no_progress) -> Document:
    """Create the task's document and (re)write its chunks; full-text vectors are a generated column.

    A step re-run (after a crash, or with new earlier outputs) replaces what
    an earlier run wrote, fields and chunks alike, in one transaction: readers
    never see a half-written set of chunks.
    """
    with transaction.atomic():
        fields = dict(tenant_id=tenant_id, title=title[:TITLE_MAX], format=fmt, source=source[:500],
                      content_sha256=content_sha256, characters=len(text), chunk_count=len(chunks))
        document, _ = Document.objects.update_or_create(
            task_id=task_id, defaults=fields, create_defaults={**fields, "created_at": timezone.now()})
        DocumentChunk.objects.filter(document=document).delete()
        for start in range(0, len(chunks), INDEX_BATCH):
            batch = chunks[start:start + INDEX_BATCH]
            DocumentChunk.objects.bulk_create(DocumentChunk(document=document, seq=start + offset, text=text_)
                                              for offset, text_ in enumerate(batch))
            progress(start + len(batch), len(chunks), f"indexed {start + len(batch)}/{len(chunks)} chunks")
    return document


_WORD = re.compile(r"[^\W\d_]{2,}", re.UNICODE)


_STOPWORDS = frozenset("""a about above after again against all am an and any are as at be because been before being
below between both but by can did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of
off on once only or other our ours ourselves out over own same she should so some such than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when where
which while who whom why will with you your yours yourself yourselves also may might must shall would could
""".split())


def summarize(text: str, sentences: int = SUMMARY_SENTENCES, progress: Progress = no_progress) -> str:
    """Extractive summary: the sentences whose words are most frequent in the document, in document order."""
    candidates = [s.strip() for s in _SENTENCE_END.split(text.replace("\n", " ")) if 30 <= len(s.strip()) <= 500]
    if not candidates:
        return text[:500].strip()
    frequency = Counter(w for w in (m.group().lower() for m in _WORD.finditer(text)) if w not in _STOPWORDS)
    if not frequency:
        return " ".join(candidates[:sentences])
    top = max(frequency.values())
    scored = []
    for position, sentence in enumerate(candidates):
        words = [w.lower() for w in _WORD.findall(sentence) if w.lower() not in _STOPWORDS]
        if words:
            scored.append((sum(frequency[w] for w in words) / top / len(words) ** 0.5, -position, sentence))
        if position % 5000 == 0:
            progress(position, len(candidates), "scoring sentences")
    best = sorted(scored, reverse=True)[:sentences]
    return " ".join(sentence for _, _, sentence in sorted(best, key=lambda item: -item[1]))


def embed_chunks(document_id: int, *, batch: int, progress: Progress = no_progress) -> int:
    """Embed the document's chunks that have no embedding yet, `batch` chunks per transaction.

    Only chunks whose embedding is still NULL are read, so a step resumed after
    a crash embeds what the killed run had not committed, never a chunk twice;
    each batch's vectors commit together (a crash loses at most one batch).
    `progress` also raises Interrupted once the task is cancelled or its lease
    lost: a worker presumed dead stops at the next batch. Returns the number of chunks.
    """
    chunks = DocumentChunk.objects.filter(document_id=document_id)
    total = chunks.count()
    done = chunks.filter(embedding__isnull=False).count()
    while True:
        pending = list(chunks.filter(embedding__isnull=True).order_by("seq").values_list("pk", "text")[:batch])
        if not pending:
            break
        vectors = embeddings.embed([text for _, text in pending])
        now = timezone.now()
        with transaction.atomic():
            DocumentChunk.objects.bulk_update(
                [DocumentChunk(pk=pk, embedding=vector, embedded_at=now)
                 for (pk, _), vector in zip(pending, vectors, strict=True)],
                ["embedding", "embedded_at"])
        crash_point("after_batch")
        done += len(pending)
        progress(done, total, f"embedded {done}/{total} chunks")
    Document.objects.filter(pk=document_id).update(embedding_model=embeddings.MODEL_NAME)
    return total


@transaction.atomic
def mark_ready(document_id: int, summary: str) -> None:
    Document.objects.filter(pk=document_id).update(summary=summary, ready_at=timezone.now())


def get_for_tenant(tenant_id: int, document_id: int) -> Document:
    document = Document.objects.filter(tenant_id=tenant_id, pk=document_id).first()
    if document is None:
        raise NotFound(f"no document {document_id} in this tenant")
    return document


def text_of(document: Document, max_chars: int) -> tuple[str, bool]:
    """The document's text from its chunks, up to `max_chars`; True if cut short."""
    parts, length, truncated = [], 0, False
    for text in document.chunks.order_by("seq").values_list("text", flat=True).iterator():
        if length >= max_chars:
            truncated = True
            break
        parts.append(text)
        length += len(text) + 2
    joined = "\n\n".join(parts)
    return joined[:max_chars], truncated or len(joined) > max_chars


def purge_documents(rows: list[Document], now: datetime) -> dict[int | str, dict[str, Any]]:
    """Retention's purge of documents past their time (registered in apps.py): each with its chunks and
    vectors; what each document's audit event records."""
    ids = [d.pk for d in rows]
    chunks = dict(DocumentChunk.objects.filter(document_id__in=ids).values_list("document_id").annotate(n=Count("pk")))
    DocumentChunk.objects.filter(document_id__in=ids).delete()
    Document.objects.filter(pk__in=ids).delete()
    # Not the title: it may name a person (ingest_document declares it personal), and audit events stay.
    return {d.pk: {"task_id": str(d.task_id), "chunks": chunks.get(d.pk, 0)} for d in rows}
