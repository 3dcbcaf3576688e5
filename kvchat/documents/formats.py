"""The formats kvchat reads: their names, as help texts and errors say them, and their suffixes;
how an error names a damaged file."""

from __future__ import annotations

from pathlib import Path

SUPPORTED = "PDF, DOCX, EPUB, TXT, Markdown or HTML"
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown"})
# What a file picker offers (any text file can be read; these are the usual names).
DOCUMENT_SUFFIXES = frozenset(
    {".pdf", ".docx", ".epub", ".txt", ".text", ".rst", ".csv"} | MARKDOWN_SUFFIXES | HTML_SUFFIXES
)


def located(path: Path, part: str = "") -> str:
    """How a message names `path`, or its `part` (an EPUB's chapter file): "book.epub, c3.xhtml"."""
    return f"{path}, {part}" if part else str(path)


def unreadable(path: Path, kind: str, error: Exception) -> str:
    """The line for a `kind` file (DOCX, EPUB, PDF) whose library failed with `error`: its message
    where it speaks of the file (a zip or XML syntax error), a plain phrase where it speaks of
    the library's own objects ("'NoneType' object has no attribute 'nsmap'"), which tells a
    user nothing."""
    reason = f"its parts are not laid out as {kind} requires" if isinstance(error, (AttributeError, TypeError)) else str(error)
    return f"{path}: not a readable {kind} ({reason})"
