"""Plain text and Markdown with encoding detection; HTML rendered to text by inscriptis."""

from __future__ import annotations

from pathlib import Path

from charset_normalizer import from_bytes
from inscriptis import get_text

from kvchat.documents.model import Document, Page
from kvchat.errors import DocumentError

CHAOS_TIE = 0.2
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown"}
CONTROL_BYTES = set(range(0, 9)) | {11, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 127}


def _looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if b"\x00" in sample and not (sample[:2] in (b"\xff\xfe", b"\xfe\xff")):
        return True
    controls = sum(1 for byte in sample if byte in CONTROL_BYTES)
    return controls > len(sample) * 0.05


def decode_text(path: Path, data: bytes) -> str:
    """Decode bytes as text, detecting the encoding; refuse binary data."""
    if _looks_binary(data):
        raise DocumentError(
            f"{path}: looks like a binary file, not text",
            "give a PDF, TXT, Markdown or HTML document",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    matches = list(from_bytes(data))
    if not matches:
        raise DocumentError(f"{path}: cannot tell the text encoding", "save it as UTF-8")
    return str(_prefer_western(matches))


def _prefer_western(matches: list) -> object:
    """Short Western European texts look as plausible in Baltic or Central European code pages;
    Windows-1252 is by far the most common legacy encoding, so it wins a near tie."""
    best = matches[0]
    for match in matches:
        if match.encoding == "cp1252" and match.chaos <= best.chaos + CHAOS_TIE:
            return match
    return best


def _single_page(path: Path, kind: str, text: str) -> Document:
    text = text.replace("\r\n", "\n").strip()
    return Document(path=path, kind=kind, text=text, pages=[Page(1, 0, len(text))])


def read_text(path: Path, data: bytes) -> Document:
    kind = "markdown" if path.suffix.lower() in MARKDOWN_SUFFIXES else "text"
    return _single_page(path, kind, decode_text(path, data))


def read_html(path: Path, data: bytes) -> Document:
    return _single_page(path, "html", get_text(decode_text(path, data)))
