"""Documents: formats, extraction, chunks, summaries, the allow-lists, and the read tools."""

import base64
import os
from ipaddress import ip_address

import pytest

from idemops_demo import documents
from tests.support.documents_fixtures import long_text, make_pdf, pdf_of_text
from tools_app.conf import override_conf
from tools_app.core import redaction, url_allowlist
from tools_app.core.errors import InvalidInput, NotFound
from tools_app.models import Task
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

HTML = """<!DOCTYPE html><html><head><title>Dock  rules</title><style>p {color: red}</style>
<script>var secret = "do not index";</script></head>
<body><h1>Rules</h1><p>Forklifts yield to&nbsp;pedestrians.</p><ul><li>Helmets</li><li>Vests</li></ul></body></html>"""

MARKDOWN = """# Shipping guide

Read the **customs** rules and the [tariff table](https://example.com/t) first.

```
code stays
```

- one `item`
- two
"""


@pytest.mark.parametrize(("data", "filename", "expected"), [
    (make_pdf([["hello"]]), "", "pdf"),
    (HTML.encode(), "", "html"),
    (b"<p>a</p><p>b</p><div>c</div><span>d</span><a href=x>e</a>", "", "html"),
    (MARKDOWN.encode(), "", "markdown"),
    (b"Just a note.\n\nNothing special here.", "", "text"),
    (b"Just a note.", "notes.md", "markdown"),
    ("\ufeffUTF-8 with a BOM".encode(), "", "text"),
    ("Unicode text in UTF-16".encode("utf-16"), "", "text"),
])
def test_the_format_is_detected_from_the_bytes(data, filename, expected):
    assert documents.detect_format(data, filename) == expected


@pytest.mark.parametrize(("data", "declared", "message"), [
    (b"\x00\x01\x02\xff\xfe binary", "auto", "neither UTF-8"),
    (b"plain text", "pdf", "not a PDF"),
    (make_pdf([["x"]]), "text", "are a PDF"),
])
def test_undecodable_or_mislabelled_bytes_are_refused(data, declared, message):
    with pytest.raises(InvalidInput, match=message):
        documents.detect_format(data, "", declared)


def test_html_text_leaves_out_scripts_and_styles_and_keeps_blocks_apart():
    title, text = documents.extract(HTML.encode(), "html")

    assert title == "Dock rules"
    assert text == "Rules\n\nForklifts yield to pedestrians.\n\nHelmets\n\nVests"


def test_markdown_text_keeps_words_and_drops_syntax():
    title, text = documents.extract(MARKDOWN.encode(), "markdown")

    assert title == "Shipping guide"
    assert "Read the customs rules and the tariff table first." in text
    assert "code stays" in text and "- one item" in text and "**" not in text and "```" not in text


def test_pdf_text_is_extracted_page_by_page_with_progress():
    pdf = make_pdf([["First page line"], ["Second (page) line"]], title="Manual")
    progress = []

    title, text = documents.extract(pdf, "pdf", lambda done, total, message: progress.append((done, total)))

    assert title == "Manual"
    assert text == "First page line\n\nSecond (page) line"
    assert progress == [(1, 2), (2, 2)]


def test_a_pdf_without_a_text_layer_asks_for_its_text_and_a_broken_one_is_refused():
    with pytest.raises(documents.NoTextLayer, match="2 page"):
        documents.extract(make_pdf([[], []]), "pdf")
    with pytest.raises(InvalidInput, match="not a readable PDF"):
        documents.extract(b"%PDF-1.4\nthis is not really a pdf", "pdf")


def test_chunks_respect_the_size_and_keep_every_word_in_order():
    text = long_text(50_000) + "\n\n" + "x" * 3000

    chunks = documents.chunk(text, 1000)

    assert all(len(chunk) <= 1000 for chunk in chunks)
    assert " ".join(chunks).split() == text.replace("x" * 3000, " ".join(["x" * 1000] * 3)).split()
    assert documents.chunk(text, 1000) == chunks


def test_the_summary_is_made_of_the_documents_most_representative_sentences_in_order():
    text = ("Cranes lift containers at the harbor every day. " * 3 + "The cafeteria serves soup on Tuesdays. "
            + "Harbor cranes and containers need the harbor pilot. ") * 2

    summary = documents.summarize(text, sentences=2)

    assert "soup" not in summary and "harbor" in summary.lower()
    assert documents.summarize(text, sentences=2) == summary


# --- the allow-lists ------------------------------------------------------------------------------


@pytest.fixture
def allowed(settings, tmp_path):
    inside = tmp_path / "allowed"
    inside.mkdir()
    (inside / "doc.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", inside / "link.txt")
    override_conf(settings,
                  document_allowed_dirs=[str(inside)],
                  document_allowed_url_prefixes=["https://docs.example.com/public/"])
    return inside


def test_paths_must_resolve_inside_an_allowed_directory(allowed):
    assert documents.read_path(str(allowed / "doc.txt")) == b"inside"
    for path in [allowed / ".." / "secret.txt", allowed / "link.txt", "relative.txt", "/etc/hostname"]:
        with pytest.raises(InvalidInput):
            documents.read_path(str(path))
    with pytest.raises(NotFound):
        documents.read_path(str(allowed / "missing.txt"))


@pytest.mark.parametrize("url", [
    "https://docs.example.com/private/a.pdf",
    "http://docs.example.com/public/a.pdf",
    "https://docs.example.com:8443/public/a.pdf",
    "https://docs.example.com.evil.io/public/a.pdf",
    "https://user:pw@docs.example.com/public/a.pdf",
    "file:///etc/passwd",
    "ftp://docs.example.com/public/a.pdf",
])
def test_urls_must_match_an_allowed_prefix_exactly(allowed, url):
    with pytest.raises(InvalidInput):
        documents.allowed_url(url)


def test_an_allowed_url_is_accepted_and_shown_without_its_query(allowed, monkeypatch):
    # This machine has no DNS: play it (the answer must be a public address).
    monkeypatch.setattr(url_allowlist, "resolve", lambda host, port: [ip_address("93.184.215.14")])
    url = "https://docs.example.com/public/guide.pdf?token=s3cret"

    assert str(documents.allowed_url(url).url) == url
    assert redaction.public_url(url) == "https://docs.example.com/public/guide.pdf"


# --- the read tools --------------------------------------------------------------------------------


def ingest(caller, arguments, key):
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ingest_document", "arguments": arguments, "idempotency_key": key})
    task = Task.objects.get(pk=result.result["task_id"])
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    task.refresh_from_db()
    return task.result


def test_search_finds_ranked_passages_of_the_tenants_own_documents_only(transactional_db, caller, other_tenant,
                                                                       settings):
    override_conf(settings, task_call_wait_seconds=0)
    mine = ingest(caller, {"text": "The harbor pilot boards at dawn. Pilots board vessels daily.",
                           "title": "Pilots"}, "a")
    ingest(caller, {"content_base64": base64.b64encode(pdf_of_text("Cranes and forklifts. The pilot rests.")).decode()},
           "b")
    other = Caller(tenant_id=other_tenant.pk, actor="agent:globex/test")
    ingest(other, {"text": "Globex pilots are secret."}, "c")

    hits = call_tool(get_tool("search_documents"), caller, {"query": "pilots boarding", "mode": "keyword"}
                     ).result["hits"]
    theirs = call_tool(get_tool("search_documents"), other, {"query": "harbor", "mode": "keyword"}).result["hits"]

    assert [hit["document_id"] for hit in hits] == [mine["document_id"]]
    assert hits[0]["title"] == "Pilots" and "**pilot**" in hits[0]["snippet"]
    assert theirs == []


def test_get_document_returns_summary_and_text_and_hides_other_tenants_documents(transactional_db, caller,
                                                                                 other_tenant, settings):
    override_conf(settings, task_call_wait_seconds=0)
    result = ingest(caller, {"text": long_text(5000)}, "d")

    document = call_tool(get_tool("get_document"), caller, {"document_id": result["document_id"],
                                                             "include_text": True, "max_chars": 100}).result
    stolen = call_tool(get_tool("get_document"), Caller(tenant_id=other_tenant.pk, actor="x"),
                       {"document_id": result["document_id"]})

    assert document["summary"] == result["summary"] and document["ready"] is True
    assert len(document["text"]) == 100 and document["text_truncated"] is True
    assert stolen.error.error_class == "not_found"
