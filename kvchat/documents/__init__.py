"""Documents: read PDF (with OCR for scanned pages), DOCX, EPUB, text, Markdown and HTML into plain
text that knows its pages, every format normalized the same way (normalize.py) by building its
Document with Document.from_pages."""

from kvchat.documents.bundle import bundle
from kvchat.documents.formats import DOCUMENT_SUFFIXES, SUPPORTED
from kvchat.documents.model import Document, Page
from kvchat.documents.loader import STDIN, load_document
from kvchat.documents.ocr import PageProgress

__all__ = ["DOCUMENT_SUFFIXES", "SUPPORTED", "Document", "Page", "PageProgress", "STDIN", "bundle", "load_document"]
