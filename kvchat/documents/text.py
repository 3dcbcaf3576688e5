"""Plain text and Markdown with encoding detection; HTML rendered to text (markup.py)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from pathlib import Path

from charset_normalizer import from_bytes

from kvchat.documents.formats import MARKDOWN_SUFFIXES, SUPPORTED, located
from kvchat.documents.limits import TextBudget
from kvchat.documents.markup import markup_text
from kvchat.documents.model import Document
from kvchat.errors import DocumentError

CHAOS_TIE = 0.2
CONTROL_BYTES = set(range(0, 9)) | {11, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 127}
SAMPLE_BYTES = 8192
# Byte order marks of UTF-32 and UTF-16; UTF-32-LE's begins with UTF-16-LE's, so it is tried first.
WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
# UTF-16 without a BOM is told by its zero bytes: the high byte of every Latin character is 0,
# so one half of the bytes (odd ones for little-endian) is mostly zeros and the other has almost none.
UTF16_ZERO_HALF = 0.6
UTF16_OTHER_HALF = 0.01


def _controls(codes: Iterable[int]) -> int:
    return sum(1 for code in codes if code in CONTROL_BYTES)


def _looks_binary(data: bytes) -> bool:
    sample = data[:SAMPLE_BYTES]
    return b"\x00" in sample or _controls(sample) > len(sample) * 0.05


def _zero_share(half: bytes) -> float:
    return half.count(0) / max(len(half), 1)


def _wide_encoding(data: bytes) -> str | None:
    """UTF-32 or UTF-16 by its BOM, or UTF-16 without one by the zero-byte pattern of Latin text."""
    for bom, encoding in WIDE_BOMS:
        if data.startswith(bom):
            return encoding
    sample = data[:SAMPLE_BYTES]
    if len(data) % 2 or len(sample) < 4:
        return None
    even, odd = _zero_share(sample[0::2]), _zero_share(sample[1::2])
    if odd >= UTF16_ZERO_HALF and even <= UTF16_OTHER_HALF:
        return "utf-16-le"
    if even >= UTF16_ZERO_HALF and odd <= UTF16_OTHER_HALF:
        return "utf-16-be"
    return None


def _decode_wide(data: bytes, encoding: str) -> str | None:
    """The text, or None when the bytes only looked like UTF-16/32: invalid, or holding a control
    character (binary data decoded as UTF-16 gives some: a zip's header, a NUL)."""
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        return None
    return None if _controls(map(ord, text[:SAMPLE_BYTES])) else text


def decode_text(path: Path, data: bytes, part: str = "") -> str:
    """Decode bytes (the file `path`, or its `part`) as text, detecting the encoding; refuse binary data."""
    encoding = _wide_encoding(data)
    text = _decode_wide(data, encoding) if encoding else None
    if text is not None:
        return text
    if encoding or _looks_binary(data):
        raise DocumentError(
            f"{located(path, part)}: looks like a binary file, not text",
            f"give a {SUPPORTED} document",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    matches = list(from_bytes(data))
    if not matches:
        raise DocumentError(f"{located(path, part)}: cannot tell the text encoding", "save it as UTF-8")
    return str(_prefer_western(matches))


def _prefer_western(matches: list) -> object:
    """Short Western European texts look as plausible in Baltic or Central European code pages;
    Windows-1252 is by far the most common legacy encoding, so it wins a near tie."""
    best = matches[0]
    for match in matches:
        if match.encoding == "cp1252" and match.chaos <= best.chaos + CHAOS_TIE:
            return match
    return best


def read_text(path: Path, data: bytes) -> Document:
    kind = "markdown" if path.suffix.lower() in MARKDOWN_SUFFIXES else "text"
    return Document.from_pages(path, kind, [TextBudget(path).take(decode_text(path, data))])


def read_html(path: Path, data: bytes) -> Document:
    return Document.from_pages(path, "html", [TextBudget(path).take(markup_text(path, decode_text(path, data)))])
