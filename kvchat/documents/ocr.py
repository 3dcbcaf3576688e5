"""OCR for the pages of a PDF that have no text layer (scans): pypdfium2 renders each page to an
image, tesseract reads it through pytesseract.

pytesseract rather than ocrmypdf: kvchat needs the text of some pages, not a new PDF. pytesseract
runs tesseract on one page image at a time, so pages that have a text layer keep it, each page
reports progress as it is done, and tesseract is the only thing to install besides the wheels
(ocrmypdf also needs Ghostscript, and rewrites the whole file). pypdfium2's wheel bundles PDFium,
so rendering needs no system tool either. Tesseract is optional: found on PATH at run time.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvchat.documents.limits import TextBudget, ocr_scale
from kvchat.errors import DocumentError

if TYPE_CHECKING:
    from PIL.Image import Image
    from pypdfium2 import PdfPage

TESSERACT = "tesseract"  # the command pytesseract runs
INSTALL_TESSERACT = "sudo apt install tesseract-ocr (Debian, Ubuntu) or brew install tesseract (macOS)"
RENDER_DPI = 300  # tesseract reads best at about 300 dpi; PDF units are 1/72 inch
# progress(done, total): `done` of the `total` pages to OCR are read; called with 0 before the first.
PageProgress = Callable[[int, int], None]


def tesseract_installed() -> bool:
    return shutil.which(TESSERACT) is not None


def _render(path: Path, page: PdfPage, number: int) -> Image:
    """Page `number` (1-based) as a grayscale image at RENDER_DPI, or smaller where that would
    take more pixels than limits.py allows: a page can measure a million points a side."""
    scale = ocr_scale(path, number, page.get_width(), page.get_height(), RENDER_DPI / 72)
    return page.render(scale=scale, grayscale=True).to_pil()


def ocr_pages(
    path: Path, data: bytes, indices: Sequence[int], progress: PageProgress | None = None, budget: TextBudget | None = None
) -> list[str]:
    """What tesseract reads on each page of the PDF `data` in `indices` (0-based), in that order;
    `budget` counts the text as each page is read."""
    import pypdfium2
    import pytesseract

    report = progress or (lambda done, total: None)
    take = budget.take if budget is not None else str
    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as error:
        raise DocumentError(f"{path}: cannot render the PDF's pages for OCR ({error})", "is the file complete?") from None
    texts: list[str] = []
    try:
        report(0, len(indices))
        for index in indices:
            image = _render(path, pdf[index], index + 1)
            try:
                text = pytesseract.image_to_string(image)
            except (pytesseract.TesseractError, pytesseract.TesseractNotFoundError) as error:
                raise DocumentError(
                    f"{path}: OCR failed on page {index + 1} ({error})",
                    f"check the tesseract installation, or reinstall it: {INSTALL_TESSERACT}",
                ) from None
            texts.append(take(text))
            report(len(texts), len(indices))
    finally:
        pdf.close()
    return texts
