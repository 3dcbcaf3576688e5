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

from kvchat.errors import DocumentError

TESSERACT = "tesseract"  # the command pytesseract runs
INSTALL_TESSERACT = "sudo apt install tesseract-ocr (Debian, Ubuntu) or brew install tesseract (macOS)"
RENDER_DPI = 300  # tesseract reads best at about 300 dpi; PDF units are 1/72 inch
# progress(done, total): `done` of the `total` pages to OCR are read; called with 0 before the first.
PageProgress = Callable[[int, int], None]


def tesseract_installed() -> bool:
    return shutil.which(TESSERACT) is not None


def ocr_pages(path: Path, data: bytes, indices: Sequence[int], progress: PageProgress | None = None) -> list[str]:
    """What tesseract reads on each page of the PDF `data` in `indices` (0-based), in that order."""
    import pypdfium2
    import pytesseract

    report = progress or (lambda done, total: None)
    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as error:
        raise DocumentError(f"{path}: cannot render the PDF's pages for OCR ({error})", "is the file complete?") from None
    texts: list[str] = []
    try:
        report(0, len(indices))
        for index in indices:
            image = pdf[index].render(scale=RENDER_DPI / 72, grayscale=True).to_pil()
            try:
                texts.append(pytesseract.image_to_string(image))
            except (pytesseract.TesseractError, pytesseract.TesseractNotFoundError) as error:
                raise DocumentError(
                    f"{path}: OCR failed on page {index + 1} ({error})",
                    f"check the tesseract installation, or reinstall it: {INSTALL_TESSERACT}",
                ) from None
            report(len(texts), len(indices))
    finally:
        pdf.close()
    return texts
