"""Vectors and semantic search: the embed step, search modes, reciprocal-rank fusion, pgvector at start-up,
and a worker killed inside the embed step that resumes without embedding a chunk twice."""

import re

import pytest
from django.db import connection

from idemops_demo import documents
from idemops_demo.documents import vector_extension
from idemops_demo.documents.search import fuse
from idemops_demo.models import Document, DocumentChunk
from tests.support.documents_fixtures import long_text
from tests.support.processes import Worker
from tests.support.task_stack import swept_until, wait_until
from tools_app.conf import override_conf
from tools_app.models import StepRun, Task, TaskStatus, Tenant
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

DOCUMENTS = {
    "Refunds": "Customers who are unhappy with a purchase may return the goods within thirty days and receive "
               "their money in full.",
    "Printers": "When the warning light blinks, replace the toner cartridge of the office printer.",
    "Cats": "The cat slept on the warm windowsill all afternoon, purring quietly.",
    "Revenue": "Quarterly revenue grew by ten percent thanks to strong sales in Europe.",
}
PARAPHRASES = {"reimbursement policy for dissatisfied shoppers": "Refunds",
               "kitten napping by a sunny window": "Cats"}


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def ingest(caller, arguments, key) -> dict:
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ingest_document", "arguments": arguments, "idempotency_key": key})
    task = Task.objects.get(pk=result.result["task_id"])
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    task.refresh_from_db()
    return task.result


def search(caller, query, mode=None, limit=10) -> list[dict]:
    arguments = {"query": query, "limit": limit, **({"mode": mode} if mode else {})}
    result = call_tool(get_tool("search_documents"), caller, arguments)
    assert result.error is None, result.error
    return result.result["hits"]


@pytest.fixture
def library(transactional_db, caller, settings):
    override_conf(settings, task_call_wait_seconds=0)
    return {title: ingest(caller, {"text": text, "title": title}, f"doc-{title}")["document_id"]
            for title, text in DOCUMENTS.items()}


def test_a_paraphrase_sharing_no_word_with_the_document_is_found_by_meaning_and_not_by_keywords(caller, library):
    for query, title in PARAPHRASES.items():
        # given a query that shares not one word with the document it means
        assert not words(query) & words(DOCUMENTS[title])

        # when it is searched in each mode
        keyword, semantic, hybrid = (search(caller, query, mode) for mode in ("keyword", "semantic", "hybrid"))

        # then keywords find nothing, and meaning (alone or fused) finds that document first
        assert keyword == []
        assert semantic[0]["document_id"] == library[title] and semantic[0]["matched_by"] == ["semantic"]
        assert hybrid[0]["document_id"] == library[title]
        assert semantic[0]["rank"] > semantic[1]["rank"]


def test_hybrid_is_the_default_and_a_chunk_both_rankings_find_comes_first(caller, library):
    hits = search(caller, "printer toner cartridge")

    assert hits[0]["document_id"] == library["Printers"]
    assert hits[0]["matched_by"] == ["keyword", "semantic"]
    assert "**printer**" in hits[0]["snippet"]
    assert all(hit["matched_by"] == ["semantic"] for hit in hits[1:])


def test_reciprocal_rank_fusion_sums_one_over_k_plus_rank_across_rankings():
    fused = fuse({"keyword": [(1, 0.9), (2, 0.5)], "semantic": [(2, 0.8), (3, 0.7), (1, 0.1)]}, k=60)

    assert [(pk, found) for pk, _, found in fused] == [(2, ["keyword", "semantic"]), (1, ["keyword", "semantic"]),
                                                       (3, ["semantic"])]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[2][1] == pytest.approx(1 / 62)


def test_semantic_search_sees_only_the_tenants_own_ready_documents(caller, other_tenant, library):
    other = Caller(tenant_id=other_tenant.pk, actor="agent:globex/test")
    Document.objects.filter(pk=library["Cats"]).update(ready_at=None)  # as while its ingest still runs

    assert search(other, "reimbursement policy for dissatisfied shoppers", "semantic") == []
    assert library["Cats"] not in {hit["document_id"] for hit in search(caller, "kitten napping", "semantic")}


def test_ingest_embeds_every_chunk_with_the_model_it_names(transactional_db, caller, settings):
    override_conf(settings, task_call_wait_seconds=0, document_chunk_chars=300, document_embed_batch=7)
    result = ingest(caller, {"text": long_text(9000)}, "long")

    document = Document.objects.get(pk=result["document_id"])
    chunks = DocumentChunk.objects.filter(document=document)
    assert chunks.count() == result["chunks"] > 20
    assert not chunks.filter(embedding__isnull=True).exists()
    assert document.embedding_model == documents.EMBEDDING_MODEL
    assert len(chunks.first().embedding) == 256


def test_the_search_mode_is_checked_and_named_when_wrong(caller, library):
    result = call_tool(get_tool("search_documents"), caller, {"query": "cats", "mode": "fuzzy"})

    assert result.error.error_class == "invalid_input" and "mode" in result.error.message


def test_the_vector_index_is_an_hnsw_index_for_cosine_distance(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'chunk_embedding_hnsw'")
        (definition,) = cursor.fetchone()

    assert "USING hnsw" in definition and "vector_cosine_ops" in definition


def test_a_server_without_the_extension_is_refused_with_what_to_install(db):
    assert vector_extension.check_pgvector(databases=["default"]) == []

    with pytest.raises(vector_extension.MissingExtension) as refused:
        vector_extension.require(connection, "vector_that_this_server_lacks")

    message = str(refused.value)
    assert "does not have the pgvector extension ('vector_that_this_server_lacks')" in message
    assert "postgresql-<major>-pgvector" in message and "DATABASE_URL" in message


@pytest.mark.live
def test_an_mcp_client_searches_by_meaning_and_the_schema_offers_the_modes(web_server, token, settings):
    from tests.support.mcp_client import call_sync

    # given the token's tenant's documents, ingested and ready
    override_conf(settings, task_call_wait_seconds=0)
    tenant_id = Tenant.objects.get(slug="acme").pk
    caller = Caller(tenant_id=tenant_id, actor="agent:acme/test")
    refunds = ingest(caller, {"text": DOCUMENTS["Refunds"], "title": "Refunds"}, "mcp-refunds")["document_id"]
    ingest(caller, {"text": DOCUMENTS["Printers"], "title": "Printers"}, "mcp-printers")

    # when a real MCP client searches with a paraphrase, in each mode
    answers = {mode: call_sync(web_server.mcp_url, token, "search_documents", {
        "query": "reimbursement policy for dissatisfied shoppers", "mode": mode}) for mode in ("keyword", "semantic")}

    # then meaning finds it and words do not
    assert answers["keyword"].structured_content["hits"] == []
    assert answers["semantic"].structured_content["hits"][0]["document_id"] == refunds
    schema = get_tool("search_documents").input_model.model_json_schema()
    assert schema["properties"]["mode"]["enum"] == ["keyword", "semantic", "hybrid"]


# --- a worker killed inside the embed step ----------------------------------------------------------

@pytest.mark.live
def test_a_worker_killed_inside_the_embed_step_resumes_without_embedding_a_chunk_twice(transactional_db, caller):
    # given worker A, armed to die right after its first batch of embeddings commits
    env = {"IDEMOPS_TASK_LEASE_SECONDS": "2", "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3", "IDEMOPS_Q_WORKERS": "1",
           "IDEMOPS_DOCUMENT_CHUNK_CHARS": "300", "IDEMOPS_DOCUMENT_EMBED_BATCH": "8"}
    worker_a = Worker(name="embed-crash-a", IDEMOPS_CRASH_POINTS="after_batch", **env)
    result = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {
        "text": long_text(12_000)}, "idempotency_key": "embed-crash"})
    task = Task.objects.get(pk=result.result["task_id"])
    try:
        # The crash point SIGKILLs the worker process; its cluster would start another: stop the cluster too.
        worker_a.wait_log("after death", timeout=120)
        worker_a.kill()
        document = Document.objects.get(task=task)
        chunks = DocumentChunk.objects.filter(document=document)
        before = dict(chunks.filter(embedding__isnull=False).values_list("pk", "embedded_at"))
        total = chunks.count()
        assert len(before) == 8 and total > 30
        task.refresh_from_db()
        assert (task.status, task.current_step) == (TaskStatus.RUNNING, "embed")

        # when worker B starts and the sweep hands it the task once A's lease has expired
        worker_b = Worker(name="embed-crash-b", **env)
        try:
            wait_until(lambda: swept_until(task, TaskStatus.SUCCEEDED), timeout=120,
                       what="the task to succeed on worker B")
        finally:
            worker_b.stop(grace=3)
    finally:
        worker_a.stop(grace=1)

    # then the 8 chunks embedded before the crash were not embedded again, and every other chunk once
    after = dict(chunks.values_list("pk", "embedded_at"))
    assert {pk: after[pk] for pk in before} == before
    rewritten = [pk for pk in after if pk not in before]
    assert len(rewritten) == total - 8 and all(after[pk] > max(before.values()) for pk in rewritten)
    assert not chunks.filter(embedding__isnull=True).exists()
    runs = list(StepRun.objects.filter(task=task, step="embed").order_by("started_at").values_list("worker",
                                                                                                   "outcome"))
    assert [outcome for _, outcome in runs] == ["running", "succeeded"]  # the killed run never finished
