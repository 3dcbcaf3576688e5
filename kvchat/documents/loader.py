"""Pick a reader by content and suffix; turn every failure into a DocumentError with a hint."""

from __future__ import annotations

from pathlib import Path

from kvchat.documents.docx import read_docx
from kvchat.documents.epub import read_epub
from kvchat.documents.formats import HTML_SUFFIXES, SUPPORTED
from kvchat.documents.model import Document
from kvchat.documents.ocr import PageProgress
from kvchat.documents.pdf import read_pdf
from kvchat.documents.text import read_html, read_text
from kvchat.errors import DocumentError


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise DocumentError(f"{path}: no such file", "check the path")
    if path.is_dir():
        raise DocumentError(f"{path}: is a directory", f"give one {SUPPORTED} file")
    try:
        return path.read_bytes()
    except OSError as error:
        raise DocumentError(f"{path}: cannot read ({error.strerror})", "check permissions") from None


def load_document(path: Path | str, progress: PageProgress | None = None) -> Document:
    """Read `path` into a Document. Raises DocumentError for anything that is not usable text.
    `progress(done, total)` follows the OCR of a PDF's pages that have no text layer, if any."""
    path = Path(path)
    data = _read_bytes(path)
    suffix = path.suffix.lower()
    if not data.strip():
        raise DocumentError(f"{path}: the file is empty", f"give a {SUPPORTED} file with text in it")
    if data.lstrip()[:5] == b"%PDF-" or suffix == ".pdf":
        document = read_pdf(path, data, progress)
    elif suffix == ".docx":
        document = read_docx(path, data)
    elif suffix == ".epub":
        document = read_epub(path, data)
    elif suffix in HTML_SUFFIXES:
        document = read_html(path, data)
    else:
        document = read_text(path, data)
    if not document.text.strip():
        raise DocumentError(f"{path}: no text in the document", f"give a {SUPPORTED} file with text")
    return document
