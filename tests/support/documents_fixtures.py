"""Real documents for the ingest tests: PDFs written by hand (standard Helvetica
text, the way simple generators write them), and long texts."""

from __future__ import annotations

import random

WORDS = ("ledger invoice shipment warehouse pallet carrier customs tariff freight manifest audit refund "
         "supplier contract clause penalty delivery routing dock forklift inventory reconciliation batch "
         "container vessel harbor pilot crane manifest berth schedule delay surcharge rebate quota").split()


def paragraphs(count: int, seed: int = 7) -> list[str]:
    """Deterministic prose-like paragraphs (same seed, same text)."""
    rng = random.Random(seed)
    result = []
    for number in range(count):
        sentences = []
        for _ in range(rng.randint(3, 6)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 18))]
            sentences.append(" ".join(words).capitalize() + ".")
        result.append(f"Section {number}. " + " ".join(sentences))
    return result


def long_text(min_chars: int, seed: int = 7) -> str:
    """At least `min_chars` of prose (a paragraph more at most)."""
    rng_paragraphs = paragraphs(max(8, min_chars // 500), seed)
    while sum(map(len, rng_paragraphs)) + 2 * len(rng_paragraphs) < min_chars:
        rng_paragraphs = paragraphs(len(rng_paragraphs) * 2, seed)
    kept, length = [], 0
    for paragraph in rng_paragraphs:
        kept.append(paragraph)
        length += len(paragraph) + 2
        if length >= min_chars:
            break
    return "\n\n".join(kept)


def _escape(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A PDF whose page i shows the lines pages[i] (an empty list: a page without text)."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below
    page_tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    kids = []
    for lines in pages:
        text = "".join(f"({_escape(line)}) Tj T* " for line in lines)
        stream = f"BT /F1 9 Tf 11 TL 40 760 Td {text}ET".encode("latin-1") if lines else b""
        content = add(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R "
                        b">> >> /Contents %d 0 R >>" % (page_tree, font, content)))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % page_tree
    objects[page_tree - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % kid for kid in kids), len(kids))
    info = add(b"<< /Title (%s) >>" % _escape(title).encode("latin-1")) if title else None

    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    trailer = b"<< /Size %d /Root %d 0 R" % (len(objects) + 1, catalog)
    if info:
        trailer += b" /Info %d 0 R" % info
    out += b"trailer\n%s >>\nstartxref\n%d\n%%%%EOF\n" % (trailer, xref)
    return bytes(out)


def pdf_of_text(text: str, lines_per_page: int = 60, chars_per_line: int = 95, title: str | None = None) -> bytes:
    """`text` laid out on as many pages as it takes."""
    lines: list[str] = []
    for paragraph in text.split("\n\n"):
        words, line = paragraph.split(), ""
        for word in words:
            if len(line) + len(word) + 1 > chars_per_line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines += [line, ""]
    pages = [lines[i:i + lines_per_page] for i in range(0, len(lines), lines_per_page)]
    return make_pdf(pages, title=title)
