"""Pick a reader by content and suffix; turn every failure into a DocumentError with a hint.

Only a regular file is read, and at most limits.MAX_FILE_BYTES of it: a device (/dev/zero) never
ends, and opening a FIFO that no one writes to blocks, so what a path is comes from stat() before
anything is opened (and again from the open file, in case the path changed in between).

The path "-" is standard input, piped in (`pdftotext a.pdf - | kvchat ask - "…"`): read to its
end, at most MAX_FILE_BYTES, its format told by its content alone.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from pathlib import Path

from kvchat.documents.docx import read_docx
from kvchat.documents.epub import read_epub
from kvchat.documents.formats import HTML_SUFFIXES, SUPPORTED
from kvchat.documents.limits import MAX_FILE_BYTES, SPLIT_HINT, check_file_size, size_text
from kvchat.documents.model import Document
from kvchat.documents.ocr import PageProgress
from kvchat.documents.pdf import read_pdf
from kvchat.documents.text import read_html, read_text
from kvchat.errors import DocumentError

# A FIFO or a device swapped in for the file after stat() must not block the open either.
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
STDIN = "-"  # the path that is standard input
STDIN_NAME = Path("<stdin>")  # how messages and the document name it
NOT_REGULAR = (  # what a path that is not a regular file is, by its mode
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _stat_error(path: Path, error: OSError) -> DocumentError:
    if error.errno == errno.ELOOP:
        return DocumentError(
            f"{path}: symlink loop (symbolic links that lead back to themselves, never to a file)",
            "point the link at a file, or give the file itself",
        )
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        if os.path.islink(path):
            return DocumentError(f"{path}: no such file (a symlink to a file that does not exist)", "check the link")
        return DocumentError(f"{path}: no such file", "check the path")
    return DocumentError(f"{path}: cannot read ({error.strerror})", "check permissions")


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise DocumentError(f"{path}: is a directory", f"give one {SUPPORTED} file")
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in NOT_REGULAR if test(mode)), "not a file")
        raise DocumentError(f"{path}: is {kind}, not a regular file", f"give a {SUPPORTED} file")


def _read_bytes(path: Path) -> bytes:
    """The bytes of the regular file at `path`, at most MAX_FILE_BYTES of them."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise _stat_error(path, error) from None
    _check_regular(path, info.st_mode)
    check_file_size(path, info.st_size)
    try:
        with os.fdopen(os.open(path, OPEN_FLAGS), "rb") as handle:
            info = os.fstat(handle.fileno())
            _check_regular(path, info.st_mode)
            check_file_size(path, info.st_size)
            data = handle.read(info.st_size + 1)  # a byte more than stat() said tells a file that grows
            if len(data) > info.st_size:  # written to as it is read (or one of /proc's, of size 0)
                data += handle.read(MAX_FILE_BYTES + 1 - len(data))
    except OSError as error:
        raise DocumentError(f"{path}: cannot read ({error.strerror})", "check permissions") from None
    check_file_size(path, len(data))
    return data


def load_document(
    path: Path | str, progress: PageProgress | None = None, cancel: threading.Event | None = None
) -> Document:
    """Read `path` into a Document. Raises DocumentError for anything that is not usable text.
    `progress(done, total)` follows the OCR of a PDF's pages that have no text layer, if any.
    Once `cancel` is set, the reading of a PDF, DOCX or EPUB stops between pages, blocks or
    chapters (OCR within a page too) with CancelledError."""
    path = Path(path)
    if str(path) == STDIN:
        path, data = STDIN_NAME, _read_stdin()
        suffix = _suffix_by_content(data)
    else:
        data = _read_bytes(path)
        suffix = path.suffix.lower()
    if not data.strip():
        raise DocumentError(f"{path}: the file is empty", f"give a {SUPPORTED} file with text in it")
    if data.lstrip()[:5] == b"%PDF-" or suffix == ".pdf":
        document = read_pdf(path, data, progress, cancel)
    elif suffix == ".docx":
        document = read_docx(path, data, cancel)
    elif suffix == ".epub":
        document = read_epub(path, data, cancel)
    elif suffix in HTML_SUFFIXES:
        document = read_html(path, data)
    else:
        document = read_text(path, data)
    if not document.text.strip():
        raise DocumentError(f"{path}: no text in the document", f"give a {SUPPORTED} file with text")
    return document


def _read_stdin() -> bytes:
    """Standard input to its end, at most MAX_FILE_BYTES (a terminal is refused: it has no end)."""
    stream = sys.stdin.buffer if sys.stdin is not None else None
    if stream is None or stream.isatty():
        raise DocumentError(
            f"{STDIN_NAME}: standard input is {'closed' if stream is None else 'a terminal'}, not a document",
            f'pipe one in, e.g. cat notes.txt | kvchat ask - "…", or give the {SUPPORTED} file itself',
        )
    data = stream.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(
            f"{STDIN_NAME}: more than {size_text(MAX_FILE_BYTES)} on standard input, the limit for a document", SPLIT_HINT
        )
    return data


def _suffix_by_content(data: bytes) -> str:
    """The suffix that reads `data` from standard input: a zip holding a Word document or an EPUB's
    container, HTML by its first tag, text otherwise (a PDF is told by its header in any case)."""
    if data[:4] == b"PK\x03\x04":
        return ".docx" if b"word/document.xml" in data else ".epub" if b"META-INF/container.xml" in data else ".zip"
    start = data[:1024].lstrip().lower()
    return ".html" if start.startswith((b"<!doctype html", b"<html")) else ".txt"
