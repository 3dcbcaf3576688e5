"""The formats kvchat reads: their names, as help texts and errors say them, and their suffixes."""

from __future__ import annotations

SUPPORTED = "PDF, DOCX, EPUB, TXT, Markdown or HTML"
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown"})
# What a file picker offers (any text file can be read; these are the usual names).
DOCUMENT_SUFFIXES = frozenset(
    {".pdf", ".docx", ".epub", ".txt", ".text", ".rst", ".csv"} | MARKDOWN_SUFFIXES | HTML_SUFFIXES
)
