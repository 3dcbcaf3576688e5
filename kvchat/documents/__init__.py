"""Documents: read PDF, text, Markdown and HTML into plain text that knows its pages, every format
normalized the same way (normalize.py) by building its Document with Document.from_pages."""

from kvchat.documents.model import Document, Page
from kvchat.documents.loader import DOCUMENT_SUFFIXES, load_document

__all__ = ["DOCUMENT_SUFFIXES", "Document", "Page", "load_document"]
