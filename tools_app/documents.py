"""Documents: read, recognise, extract, chunk, index and summarize; and search.

The functions here are the steps of the `ingest_document` pipeline (declared
in tools_app/tools/documents.py) and the queries of its read tools. Each
step is deterministic in its inputs, so a step that runs again after a crash
produces the same output, and a resumed ingest ends exactly like an
uninterrupted one.

Sources are text given inline, bytes given as base64, or a path or URL on
the allow-lists in settings (IDEMOPS DOCUMENT_ALLOWED_DIRS and
DOCUMENT_ALLOWED_URL_PREFIXES); anything else is refused as invalid_input
before a task is created.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
import re
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from html.parser import HTMLParser
from pathlib import Path

import httpx2
from django.conf import settings
from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchRank
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from tools_app import redaction, url_allowlist
from tools_app.errors import InvalidInput, NotFound, PermissionDenied, Transient
from tools_app.models import Document, DocumentChunk
from tools_app.models.documents import SEARCH_CONFIG

logger = logging.getLogger(__name__)

FORMATS = ("text", "markdown", "html", "pdf")
READ_BLOCK = 1024 * 1024
INDEX_BATCH = 250
SUMMARY_SENTENCES = 5
TITLE_MAX = 300

Progress = Callable[[float, float | None, str], None]


def _no_progress(done: float, total: float | None = None, message: str = "") -> None:
    pass


def max_bytes() -> int:
    return settings.IDEMOPS["DOCUMENT_MAX_BYTES"]


# --- sources and the allow-lists -------------------------------------------------------------


def allowed_path(raw: str) -> Path:
    """The real path of `raw` if it lies inside an allowed directory (symlinks resolved)."""
    path = Path(raw)
    if not path.is_absolute():
        raise InvalidInput("path must be absolute")
    real = path.resolve()
    for directory in settings.IDEMOPS["DOCUMENT_ALLOWED_DIRS"]:
        if real.is_relative_to(Path(directory).resolve()):
            return real
    raise InvalidInput("path is not under a directory this server may read (IDEMOPS_DOCUMENT_ALLOWED_DIRS)")


def allowed_url(raw: str) -> url_allowlist.Target:
    """Where `raw` may be fetched from, if it passes IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES (tools_app.url_allowlist)."""
    return url_allowlist.check(raw, settings.IDEMOPS["DOCUMENT_ALLOWED_URL_PREFIXES"], field="url")


public_url = redaction.public_url  # a URL as it may be shown and stored


def decode_base64(value: str) -> bytes:
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("content_base64 is not valid base64") from None
    _check_size(len(data))
    return data


def _check_size(size: int) -> None:
    if size > max_bytes():
        raise InvalidInput(f"the document is larger than the {max_bytes()} bytes this server accepts")


def read_path(raw: str, progress: Progress = _no_progress) -> bytes:
    path = allowed_path(raw)
    try:
        size = path.stat().st_size
        _check_size(size)
        parts = []
        with path.open("rb") as handle:
            while block := handle.read(READ_BLOCK):
                parts.append(block)
                progress(sum(map(len, parts)), size, "reading file")
    except FileNotFoundError:
        raise NotFound("no such file") from None
    except PermissionError:
        raise PermissionDenied("this server may not read that file") from None
    except IsADirectoryError:
        raise InvalidInput("path is a directory") from None
    return b"".join(parts)


def fetch_url(raw: str, progress: Progress = _no_progress) -> bytes:
    """GET the URL. Network trouble, 429 and 5xx are transient; redirects and other 4xx are final.

    The URL is checked again here (a task's stored arguments are not trusted) and fetched from
    the address the check resolved.
    """
    target = allowed_url(raw)
    timeout = settings.IDEMOPS["DOCUMENT_FETCH_TIMEOUT_SECONDS"]
    try:
        with httpx2.Client(timeout=timeout) as client, closing(target.send(client, "GET", stream=True)) as response:
            _check_status(response)
            total = int(response.headers.get("content-length") or 0) or None
            if total:
                _check_size(total)
            parts, received = [], 0
            for block in response.iter_bytes(READ_BLOCK):
                received += len(block)
                _check_size(received)
                parts.append(block)
                progress(received, total, "downloading")
            return b"".join(parts)
    except httpx2.TransportError as exc:
        raise Transient(f"fetching the document failed: {type(exc).__name__}") from None


def _check_status(response) -> None:
    status = response.status_code
    if status == 429 or status >= 500:
        retry_after = response.headers.get("retry-after", "")
        raise Transient(f"the document server answered {status}",
                        retry_after=float(retry_after) if retry_after.isdigit() else None)
    if 300 <= status < 400:
        raise InvalidInput(f"the document server answered {status} (a redirect); give the final URL")
    if status in (401, 403):
        raise PermissionDenied(f"the document server answered {status}")
    if status in (404, 410):
        raise NotFound(f"the document server answered {status}")
    if status >= 400:
        raise InvalidInput(f"the document server answered {status}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- formats ----------------------------------------------------------------------------------

_HTML_START = re.compile(rb"^\s*(<!doctype\s+html|<html|<head|<body)", re.IGNORECASE)
_HTML_TAGS = re.compile(r"</?(p|div|span|a|h[1-6]|ul|ol|li|table|tr|td|br|body|head|title)\b", re.IGNORECASE)
_MARKDOWN_SIGNALS = (
    re.compile(r"^#{1,6} \S", re.MULTILINE),
    re.compile(r"^```", re.MULTILINE),
    re.compile(r"^\s*([-*+]|\d+\.) \S", re.MULTILINE),
    re.compile(r"\[[^\]\n]+\]\([^)\s]+\)"),
    re.compile(r"(\*\*|__)[^*_\n]+\1"),
    re.compile(r"^> \S", re.MULTILINE),
)
_EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html", ".txt": "text",
               ".pdf": "pdf"}


def is_pdf(data: bytes) -> bool:
    return data.lstrip()[:5] == b"%PDF-"


def decode_text(data: bytes) -> str:
    for encoding in ("utf-8-sig", "utf-16"):
        if encoding == "utf-16" and data[:2] not in (b"\xff\xfe", b"\xfe\xff"):
            continue
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        if "\x00" not in text:
            return text
    raise InvalidInput("the document is neither UTF-8 (or UTF-16) text nor a PDF")


def detect_format(data: bytes, filename: str = "", declared: str = "auto") -> str:
    if declared != "auto":
        if (declared == "pdf") != is_pdf(data):
            raise InvalidInput(f"format {declared} was declared, but the bytes are "
                               f"{'a PDF' if is_pdf(data) else 'not a PDF'}")
        if declared != "pdf":
            decode_text(data)
        return declared
    if is_pdf(data):
        return "pdf"
    text = decode_text(data)
    by_name = _EXTENSIONS.get(Path(filename).suffix.lower()) if filename else None
    if by_name and by_name != "pdf":
        return by_name
    if _HTML_START.match(data[:1024]) or len(_HTML_TAGS.findall(text[:20_000])) >= 5:
        return "html"
    sample = text[:50_000]
    opens_with_heading = _MARKDOWN_SIGNALS[0].match(sample.lstrip())
    if opens_with_heading or sum(1 for signal in _MARKDOWN_SIGNALS if signal.search(sample)) >= 2:
        return "markdown"
    return "text"


# --- text extraction ----------------------------------------------------------------------------


class NoTextLayer(Exception):
    """A PDF with pages but no extractable text (a scan): a person has to supply the text."""


def extract(data: bytes, fmt: str, progress: Progress = _no_progress) -> tuple[str, str]:
    """(title, text) of the document."""
    if fmt == "pdf":
        return extract_pdf(data, progress)
    text = decode_text(data).replace("\r\n", "\n").replace("\r", "\n")
    if fmt == "html":
        return extract_html(text)
    if fmt == "markdown":
        return extract_markdown(text)
    return _first_line(text), tidy(text)


def extract_pdf(data: bytes, progress: Progress = _no_progress) -> tuple[str, str]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise InvalidInput("the PDF is encrypted; decrypt it before ingesting")
        pages = len(reader.pages)
        texts = []
        for number, page in enumerate(reader.pages, start=1):
            texts.append(page.extract_text() or "")
            progress(number, pages, f"page {number}/{pages}")
        title = str((reader.metadata or {}).get("/Title") or "").strip()
    except PyPdfError as exc:
        raise InvalidInput(f"not a readable PDF: {exc}") from None
    text = tidy("\n\n".join(texts))
    if pages and not text.strip():
        raise NoTextLayer(f"the PDF has {pages} page(s) but no text layer (a scan?)")
    return title or _first_line(text), text


class _TextFromHTML(HTMLParser):
    SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "header",
              "footer", "pre", "blockquote", "table", "ul", "ol", "hr", "dt", "dd"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self.heading_parts: list[str] = []
        self._skipping = 0
        self._in_title = False
        self._in_h1 = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "h1":
            self._in_h1 = True

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_title:
            self.title_parts.append(data)
        elif not self._skipping:
            self.parts.append(data)
            if self._in_h1:
                self.heading_parts.append(data)


def extract_html(html: str) -> tuple[str, str]:
    parser = _TextFromHTML()
    parser.feed(html)
    parser.close()
    text = "\n".join(" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    title = " ".join("".join(parser.title_parts).split()) or " ".join("".join(parser.heading_parts).split())
    text = tidy(text)
    return title or _first_line(text), text


_MD_FENCE = re.compile(r"^\s*(```|~~~)")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_EMPHASIS = re.compile(r"(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1")
_MD_CODE = re.compile(r"`([^`]*)`")
_MD_QUOTE = re.compile(r"^\s{0,3}>\s?")
_MD_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")


def extract_markdown(markdown: str) -> tuple[str, str]:
    lines, title, fenced = [], "", False
    for line in markdown.split("\n"):
        if _MD_FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            lines.append(line)
            continue
        if _MD_RULE.match(line):
            lines.append("")
            continue
        heading = _MD_HEADING.match(line)
        if heading:
            line = heading.group(1)
            title = title or line
        line = _MD_QUOTE.sub("", line)
        line = _MD_IMAGE.sub(r"\1", line)
        line = _MD_LINK.sub(r"\1", line)
        line = _MD_CODE.sub(r"\1", line)
        line = _MD_EMPHASIS.sub(r"\2", line)
        lines.append(line)
    text = tidy("\n".join(lines))
    return title or _first_line(text), text


def tidy(text: str) -> str:
    """Trailing spaces off, at most one blank line in a row, no blank start or end."""
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _first_line(text: str, limit: int = 120) -> str:
    """A title from the first line: cut at a word before `limit` characters."""
    for line in text.split("\n"):
        line = line.strip()
        if len(line) > limit:
            line = line[:limit].rsplit(" ", 1)[0] + "…"
        if line:
            return line
    return ""


# --- chunks -----------------------------------------------------------------------------------

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


def _pieces(text: str, size: int):
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


# --- indexing and summaries ---------------------------------------------------------------------


def index(*, tenant_id: int, task_id, title: str, fmt: str, source: str, content_sha256: str, text: str,
          chunks: list[str], progress: Progress = _no_progress) -> Document:
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


def summarize(text: str, sentences: int = SUMMARY_SENTENCES, progress: Progress = _no_progress) -> str:
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


@transaction.atomic
def mark_ready(document_id: int, summary: str) -> None:
    Document.objects.filter(pk=document_id).update(summary=summary, ready_at=timezone.now())


# --- reading ------------------------------------------------------------------------------------


def search(tenant_id: int, query: str, limit: int) -> list[dict]:
    """Ranked chunks of this tenant's ready documents matching a web-search style query."""
    parsed = SearchQuery(query, search_type="websearch", config=SEARCH_CONFIG)
    hits = (DocumentChunk.objects
            .filter(document__tenant_id=tenant_id, document__ready_at__isnull=False, search=parsed)
            .annotate(rank=SearchRank(F("search"), parsed),
                      snippet=SearchHeadline("text", parsed, config=SEARCH_CONFIG, start_sel="**", stop_sel="**",
                                             max_words=40, min_words=15))
            .select_related("document")
            .order_by("-rank", "document_id", "seq")[:limit])
    return [{"document_id": hit.document_id, "title": hit.document.title, "chunk": hit.seq,
             "rank": round(hit.rank, 6), "snippet": hit.snippet} for hit in hits]


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
