"""Recognising a document's format and extracting its text (plain text, Markdown, HTML, PDF).

Deterministic in its input, so a step that runs again after a crash produces the same output.
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser
from pathlib import Path

from idemops.tools import InvalidInput
from idemops_demo.documents.sources import Progress, no_progress

FORMATS = ("text", "markdown", "html", "pdf")


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


class NoTextLayer(Exception):
    """A PDF with pages but no extractable text (a scan): a person has to supply the text."""


def extract(data: bytes, fmt: str, progress: Progress = no_progress) -> tuple[str, str]:
    """(title, text) of the document."""
    if fmt == "pdf":
        return extract_pdf(data, progress)
    text = decode_text(data).replace("\r\n", "\n").replace("\r", "\n")
    if fmt == "html":
        return extract_html(text)
    if fmt == "markdown":
        return extract_markdown(text)
    return _first_line(text), tidy(text)


def extract_pdf(data: bytes, progress: Progress = no_progress) -> tuple[str, str]:
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
        metadata = reader.metadata
        title = str(metadata.get("/Title") or "").strip() if metadata else ""
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

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self.heading_parts: list[str] = []
        self._skipping = 0
        self._in_title = False
        self._in_h1 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "h1":
            self._in_h1 = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data: str) -> None:
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
