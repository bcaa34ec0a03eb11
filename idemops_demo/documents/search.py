"""Searching a tenant's ready documents: by words (full-text), by meaning (vectors), or both.

- keyword: PostgreSQL full-text search, websearch syntax, ranked by ts_rank;
- semantic: the query's embedding against the chunks' (cosine distance, the HNSW index);
- hybrid: reciprocal-rank fusion of the two rankings: a chunk's score is the sum,
  over the rankings it is in, of 1/(k + its rank there) (k = IDEMOPS_SEARCH_RRF_K).
  Fusing ranks rather than scores needs no calibration between ts_rank and cosine
  similarity, which live on unrelated scales; a chunk both rankings find rises.

Every hit carries a snippet (ts_headline: the matching words in **bold**, or the
chunk's opening words when it matched by meaning only) and which rankings found it.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchRank
from django.db import connection, transaction
from django.db.models import F, QuerySet
from pgvector.django import CosineDistance

from idemops_demo.documents import embeddings
from idemops_demo.documents.models import SEARCH_CONFIG, DocumentChunk
from idemops_demo.idemops_settings import DemoSettings

Mode = Literal["keyword", "semantic", "hybrid"]
MODES: tuple[str, ...] = ("keyword", "semantic", "hybrid")
# The rankings a hit can come from.
Ranking = Literal["keyword", "semantic"]


class Hit(TypedDict):
    document_id: int
    title: str
    chunk: int
    rank: float
    matched_by: list[Ranking]
    snippet: str


def _ready_chunks(tenant_id: int) -> QuerySet[DocumentChunk]:
    return DocumentChunk.objects.filter(document__tenant_id=tenant_id, document__ready_at__isnull=False)


def keyword_ranking(tenant_id: int, query: str, limit: int) -> list[tuple[int, float]]:
    """(chunk id, ts_rank) of the chunks matching the websearch query, best first."""
    parsed = SearchQuery(query, search_type="websearch", config=SEARCH_CONFIG)
    return list(_ready_chunks(tenant_id).filter(search=parsed)
                .annotate(rank=SearchRank(F("search"), parsed))
                .order_by("-rank", "document_id", "seq").values_list("pk", "rank")[:limit])


def semantic_ranking(tenant_id: int, query: str, limit: int) -> list[tuple[int, float]]:
    """(chunk id, cosine similarity) of the chunks nearest the query's meaning, best first."""
    vector = embeddings.embed_one(query)
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The tenant filter applies after the HNSW scan: let the scan go on until `limit`
            # rows pass it (pgvector 0.8's iterative scan), in exact distance order.
            cursor.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        rows = list(_ready_chunks(tenant_id).filter(embedding__isnull=False)
                    .annotate(distance=CosineDistance("embedding", vector))
                    .order_by("distance", "document_id", "seq").values_list("pk", "distance")[:limit])
    return [(pk, 1.0 - distance) for pk, distance in rows]


def fuse(rankings: dict[Ranking, list[tuple[int, float]]], k: int) -> list[tuple[int, float, list[Ranking]]]:
    """Reciprocal-rank fusion: (chunk id, score, the rankings that found it), best first."""
    scores: dict[int, float] = {}
    found_by: dict[int, list[Ranking]] = {}
    for name, ranking in rankings.items():
        for position, (pk, _) in enumerate(ranking, start=1):
            scores[pk] = scores.get(pk, 0.0) + 1.0 / (k + position)
            found_by.setdefault(pk, []).append(name)
    # Ties (found at the same ranks) fall back to the keyword ranking's order, then the id.
    order = {pk: position for position, (pk, _) in enumerate(rankings.get("keyword", []))}
    ranked = sorted(scores, key=lambda pk: (-scores[pk], order.get(pk, len(order)), pk))
    return [(pk, scores[pk], found_by[pk]) for pk in ranked]


def search(tenant_id: int, query: str, limit: int, mode: Mode = "hybrid") -> list[Hit]:
    """Ranked chunks of this tenant's ready documents for `query`, at most `limit`."""
    ranked: list[tuple[int, float, list[Ranking]]]
    if mode == "keyword":
        ranked = [(pk, score, ["keyword"]) for pk, score in keyword_ranking(tenant_id, query, limit)]
    elif mode == "semantic":
        ranked = [(pk, score, ["semantic"]) for pk, score in semantic_ranking(tenant_id, query, limit)]
    else:
        own = DemoSettings.current()
        depth = max(limit, own.search_candidates)
        ranked = fuse({"keyword": keyword_ranking(tenant_id, query, depth),
                       "semantic": semantic_ranking(tenant_id, query, depth)}, own.search_rrf_k)[:limit]
    parsed = SearchQuery(query, search_type="websearch", config=SEARCH_CONFIG)
    chunks = {chunk.pk: chunk for chunk in DocumentChunk.objects.filter(pk__in=[pk for pk, _, _ in ranked])
              .annotate(snippet=SearchHeadline("text", parsed, config=SEARCH_CONFIG, start_sel="**",
                                               stop_sel="**", max_words=40, min_words=15))
              .select_related("document").defer("embedding", "search")}
    return [{"document_id": chunks[pk].document_id, "title": chunks[pk].document.title, "chunk": chunks[pk].seq,
             "rank": round(score, 6), "matched_by": found_by, "snippet": chunks[pk].snippet}
            for pk, score, found_by in ranked if pk in chunks]
