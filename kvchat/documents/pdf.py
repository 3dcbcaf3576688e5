"""PDF text through pypdf, one Page per PDF page; pages without a text layer through OCR (ocr.py).

pypdf's plain extraction, not extraction_mode="layout": layout mode reads only a page's own
content stream, not the form XObjects that HTML-to-PDF converters draw text in. On the nine CUAD
contracts it returned no text for eight and lost the page footers of the ninth. Plain mode's
no-break spaces, soft hyphens and broken lines are normalize.py's work.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

from typing import TYPE_CHECKING

from kvchat.documents.formats import unreadable
from kvchat.documents.limits import TextBudget, check_pages
from kvchat.documents.model import Document
from kvchat.documents.ocr import INSTALL_TESSERACT, PageProgress, ocr_pages, tesseract_installed
from kvchat.errors import CancelledError, DocumentError

if TYPE_CHECKING:
    from pypdf import PdfReader


def _password_protected(path: Path) -> DocumentError:
    return DocumentError(
        f"{path}: the PDF is password-protected",
        "open it with its password in a PDF viewer and save or print an unlocked copy, then give that",
    )


def _missing_dependency(path: Path, error: Exception) -> DocumentError:
    """pypdf needs an optional package for some PDFs (cryptography for AES); kvchat installs it,
    so this is a broken installation, not a broken file."""
    return DocumentError(
        f"{path}: reading this PDF needs a package that is missing ({error})",
        "reinstall kvchat, or: pip install 'pypdf[crypto]'",
    )


def _open(path: Path, data: bytes) -> PdfReader:
    """The PDF, decrypted when it opens without a password (owner-restricted PDFs do)."""
    # pypdf is imported when a PDF is read: with its crypto providers it costs ~0.5 s of start-up.
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise _password_protected(path)
        return reader
    except DependencyError as error:
        raise _missing_dependency(path, error) from None
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError) as error:
        raise DocumentError(unreadable(path, "PDF", error), "is the file complete?") from None


def _page_texts(path: Path, reader: PdfReader, budget: TextBudget) -> list[str]:
    from pypdf.errors import DependencyError, FileNotDecryptedError

    try:
        check_pages(path, len(reader.pages), "PDF")
        return [budget.take(page.extract_text() or "") for page in reader.pages]
    except (DocumentError, CancelledError):
        raise
    except FileNotDecryptedError:
        raise _password_protected(path) from None
    except DependencyError as error:
        raise _missing_dependency(path, error) from None
    except Exception as error:  # pypdf raises many types on damaged page streams
        raise DocumentError(unreadable(path, "PDF", error), "is the file complete?") from None


def _ocr_textless_pages(
    path: Path, data: bytes, texts: list[str], progress: PageProgress | None, budget: TextBudget,
    cancel: threading.Event | None,
) -> list[str]:
    """`texts` with each page that has no text layer read by OCR, when tesseract is installed."""
    textless = [index for index, text in enumerate(texts) if not text.strip()]
    if not textless or not tesseract_installed():
        return texts
    texts = list(texts)
    for index, text in zip(textless, ocr_pages(path, data, textless, progress, budget, cancel)):
        texts[index] = text
    return texts


def read_pdf(
    path: Path, data: bytes, progress: PageProgress | None = None, cancel: threading.Event | None = None
) -> Document:
    """The PDF's text layer, and OCR's text for the pages without one (`progress` reports those;
    `cancel` stops the reading between pages, and OCR within one, with CancelledError)."""
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    budget = TextBudget(path, cancel)
    texts = _ocr_textless_pages(path, data, _page_texts(path, _open(path, data), budget), progress, budget, cancel)
    # A line's indentation in a PDF is where the layout put it, not text: it goes.
    document = Document.from_pages(path, "pdf", texts, keep_indentation=False)
    if document.text:
        return document
    if not tesseract_installed():
        raise DocumentError(
            f"{path}: the PDF has no extractable text (scanned pages?) and OCR needs tesseract, which is not installed",
            f"install it: {INSTALL_TESSERACT}",
        )
    raise DocumentError(
        f"{path}: the PDF has no extractable text, and OCR found none on its {len(texts)} page(s)",
        "are the pages blank? give a PDF with text",
    )
