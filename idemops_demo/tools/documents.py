"""Documents: `ingest_document` (a long tool: a pipeline of six checkpointed steps),
`search_documents` and `get_document` (reads).

ingest_document: receive → detect_format → extract_text → chunk → index →
embed → summarize. Each step reads the outputs before it from its StepContext and
returns its own output, which the runner checkpoints; the last step's output
is the tool's result. The work itself lives in idemops_demo.documents.
"""

from __future__ import annotations

import base64
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, model_validator

from idemops.tools import (
    InvalidInput,
    ObjectId,
    Pipeline,
    Step,
    StepContext,
    ToolContext,
    ToolInput,
    WaitFor,
    WriteInput,
    long_tool,
    public_url,
    read_tool,
)
from idemops_demo import documents
from idemops_demo.idemops_settings import DemoSettings

SOURCES = ("text", "content_base64", "path", "url")


class IngestDocumentInput(WriteInput):
    text: str | None = Field(None, description="The document itself, as text (plain, Markdown or HTML).")
    content_base64: str | None = Field(None, description="The document's bytes in base64 (a PDF, or a text file).")
    path: str | None = Field(None, max_length=1000,
                             description="An absolute path on this server, inside an allowed directory.")
    url: str | None = Field(None, max_length=2000, description="An http(s) URL under an allowed prefix.")
    filename: str | None = Field(None, max_length=255,
                                 description="The original file name; its extension helps detect the format.")
    format: Literal["auto", "text", "markdown", "html", "pdf"] = Field(
        "auto", description="The document's format; auto detects it from the bytes.")
    title: str | None = Field(None, max_length=300, description="Title to use instead of the detected one.")

    @model_validator(mode="after")
    def one_source(self) -> IngestDocumentInput:
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(SOURCES)} (got {len(given)})")
        return self


class IngestResult(BaseModel):
    document_id: int
    title: str
    format: str
    source: str
    characters: int
    chunks: int
    content_sha256: str
    summary: str


def check_source(args: IngestDocumentInput) -> None:
    """Before a task exists: the source must be readable in principle (allow-lists, encoding, size)."""
    if args.text is not None:
        if len(args.text.encode()) > documents.max_bytes():
            raise InvalidInput(f"the document is larger than the {documents.max_bytes()} bytes this server accepts")
        if not args.text.strip():
            raise InvalidInput("text is empty")
    elif args.content_base64 is not None:
        documents.decode_base64(args.content_base64)
    elif args.path is not None:
        documents.allowed_path(args.path)
    elif args.url is not None:  # one of the four, always (one_source)
        documents.allowed_url(args.url)


# --- the steps ------------------------------------------------------------------------------


def receive(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    args = ctx.arguments
    if args.text is not None:
        data, source = args.text.encode(), "upload"
    elif args.content_base64 is not None:
        data, source = documents.decode_base64(args.content_base64), "upload"
    elif args.path is not None:
        data, source = documents.read_path(args.path, ctx.progress), str(documents.allowed_path(args.path))
    elif args.url is not None:
        data, source = documents.fetch_url(args.url, ctx.progress), public_url(args.url)
    else:
        raise AssertionError("one_source lets through only arguments with exactly one source")
    return {"data_base64": base64.b64encode(data).decode(), "size": len(data), "sha256": documents.sha256(data),
            "source": source}


def _data(ctx: StepContext[IngestDocumentInput]) -> bytes:
    return base64.b64decode(ctx.outputs["receive"]["data_base64"])


def _filename(args: IngestDocumentInput) -> str:
    if args.filename:
        return args.filename
    if args.path:
        return PurePosixPath(args.path).name
    if args.url:
        return PurePosixPath(urlsplit(args.url).path).name
    return ""


def detect_format(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    return {"format": documents.detect_format(_data(ctx), _filename(ctx.arguments), ctx.arguments.format)}


def extract_text(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    args = ctx.arguments
    try:
        title, text = documents.extract(_data(ctx), ctx.outputs["detect_format"]["format"], ctx.progress)
    except documents.NoTextLayer as exc:
        # A scan: a person (or an OCR service) has to supply the text; the task waits for it.
        supplied = ctx.resume_input.get("text")
        if not supplied:
            raise WaitFor(f"{exc}: its text must be supplied.", input_request={"text": {
                "message": "The PDF has no text layer. Paste the document's text to continue.",
                "schema": {"type": "string", "minLength": 1}}}) from None
        title, text = "", documents.tidy(supplied)
    title = args.title or title or _filename(args) or "Untitled document"
    return {"title": title[:documents.TITLE_MAX], "text": text}


def chunk(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    return {"chunks": documents.chunk(ctx.outputs["extract_text"]["text"], DemoSettings.current().document_chunk_chars)}


def index(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    received, extracted = ctx.outputs["receive"], ctx.outputs["extract_text"]
    chunks = ctx.outputs["chunk"]["chunks"]
    document = documents.index(
        tenant_id=ctx.tenant_id, task_id=ctx.task_id, title=extracted["title"],
        fmt=ctx.outputs["detect_format"]["format"], source=received["source"], content_sha256=received["sha256"],
        text=extracted["text"], chunks=chunks, progress=ctx.progress)
    return {"document_id": document.pk, "chunks": len(chunks)}


def embed(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    # The vectors go to the chunk rows, a batch per transaction, not into this step's output: a
    # resumed step embeds only the chunks still without one (documents.embed_chunks).
    document_id = ctx.outputs["index"]["document_id"]
    total = documents.embed_chunks(document_id, batch=DemoSettings.current().document_embed_batch,
                                   progress=ctx.progress)
    return {"document_id": document_id, "embedded": total, "model": documents.EMBEDDING_MODEL}


def summarize(ctx: StepContext[IngestDocumentInput]) -> dict[str, Any]:
    extracted, indexed = ctx.outputs["extract_text"], ctx.outputs["index"]
    summary = documents.summarize(extracted["text"], progress=ctx.progress)
    documents.mark_ready(indexed["document_id"], summary)
    received = ctx.outputs["receive"]
    return IngestResult(
        document_id=indexed["document_id"], title=extracted["title"], format=ctx.outputs["detect_format"]["format"],
        source=received["source"], characters=len(extracted["text"]), chunks=indexed["chunks"],
        content_sha256=received["sha256"], summary=summary).model_dump()


INGEST = Pipeline(
    steps=(
        Step("receive", receive),
        Step("detect_format", detect_format),
        Step("extract_text", extract_text),
        Step("chunk", chunk),
        Step("index", index),
        Step("embed", embed),
        Step("summarize", summarize),
    ),
    final=(UnicodeError,),
    validate=check_source,
)

long_tool(
    name="ingest_document", title="Ingest a document", input_model=IngestDocumentInput, output_model=IngestResult,
    pipeline=INGEST, open_world=True,
    # The document and where it comes from: its text, a name or a path may identify a person.
    personal_fields=frozenset({"text", "content_base64", "path", "url", "filename", "title"}),
    description="Ingest a document (text, Markdown, HTML or PDF; inline, base64, or an allowed path or URL) so "
                "search_documents finds it: detect format, extract text, chunk, index, embed, summarize. Runs as a "
                "durable task that resumes from its last finished step after a crash. Requires idempotency_key: "
                "a retry with the same key rejoins the same task. The call waits a few seconds; if the task is "
                "not done by then it answers in_progress with task_id (poll get_task_status / get_task_result, or "
                "call again with the same key). Clients speaking the MCP tasks extension get a task handle at once.",
)


# --- reads --------------------------------------------------------------------------------------


class SearchDocumentsInput(ToolInput):
    query: str = Field(min_length=1, max_length=500,
                       description='Words or a question. In keyword mode web-search syntax applies: words, '
                                   '"quoted phrases", OR, -excluded.')
    limit: int = Field(10, ge=1, le=50)
    mode: Literal["keyword", "semantic", "hybrid"] = Field(
        "hybrid", description="keyword: full-text (the words must occur); semantic: by meaning (embeddings); "
                              "hybrid: both rankings fused (reciprocal-rank fusion).")


class SearchHit(BaseModel):
    document_id: int
    title: str
    chunk: int = Field(description="Position of the matching chunk in the document.")
    rank: float = Field(description="keyword: ts_rank; semantic: cosine similarity; hybrid: the fused "
                                    "reciprocal-rank score. Higher is better.")
    matched_by: list[Literal["keyword", "semantic"]] = Field(description="The rankings that found this chunk.")
    snippet: str = Field(description="The matching passage, matches in **bold** (a chunk found by meaning only "
                                     "shows its opening words).")


class SearchDocumentsOutput(BaseModel):
    hits: list[SearchHit]


class GetDocumentInput(ToolInput):
    document_id: ObjectId
    include_text: bool = False
    max_chars: int = Field(20_000, ge=1, le=500_000, description="With include_text: at most this much text.")


class DocumentOutput(IngestResult):
    """An ingested document (what its ingest answered), with its task and, on request, its text."""

    task_id: str
    ready: bool = Field(description="False while its ingest task is still running.")
    created_at: datetime
    text: str | None = None
    text_truncated: bool = False


@read_tool(name="search_documents", title="Search documents", personal_fields=frozenset({"query"}))
def search_documents(ctx: ToolContext, args: SearchDocumentsInput) -> SearchDocumentsOutput:
    """Search this tenant's ingested documents by words, by meaning, or both (mode, default hybrid); best
    matches first, with a snippet each."""
    return SearchDocumentsOutput(
        hits=[SearchHit(**hit) for hit in documents.search(ctx.tenant_id, args.query, args.limit, args.mode)])


@read_tool(name="get_document", title="Get a document",
           personal_fields=frozenset())
def get_document(ctx: ToolContext, args: GetDocumentInput) -> DocumentOutput:
    """One of this tenant's documents: title, format, size, summary, and optionally its text."""
    document = documents.get_for_tenant(ctx.tenant_id, args.document_id)
    text, truncated = documents.text_of(document, args.max_chars) if args.include_text else (None, False)
    return DocumentOutput(
        document_id=document.pk, task_id=str(document.task_id), title=document.title, format=document.format,
        source=document.source, characters=document.characters, chunks=document.chunk_count,
        content_sha256=document.content_sha256, summary=document.summary, ready=document.ready_at is not None,
        created_at=document.created_at, text=text, text_truncated=truncated)
