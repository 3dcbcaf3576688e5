"""Documents: read PDF, text, Markdown and HTML into plain text that knows its pages."""

from kvchat.documents.model import Document, Page
from kvchat.documents.loader import DOCUMENT_SUFFIXES, load_document

__all__ = ["DOCUMENT_SUFFIXES", "Document", "Page", "load_document"]
