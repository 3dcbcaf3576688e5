"""OCR for the pages of a PDF that have no text layer (scans): pypdfium2 renders each page to an
image, tesseract reads it.

tesseract rather than ocrmypdf: kvchat needs the text of some pages, not a new PDF. tesseract
reads one page image at a time, so pages that have a text layer keep it, each page reports
progress as it is done, and tesseract is the only thing to install besides the wheels (ocrmypdf
also needs Ghostscript, and rewrites the whole file). pypdfium2's wheel bundles PDFium, so
rendering needs no system tool either. Tesseract is optional: found on PATH at run time.

OCR can be stopped: `cancel` is checked between pages and while tesseract reads one
(every POLL_S), and tesseract runs as kvchat's own child, not through pytesseract: pytesseract
writes each page to /tmp/tess_* and, interrupted, leaves tesseract running (it can write its
output after the files were removed). Here the page image lives in a temporary folder that
ocr_pages removes in a `finally`, once tesseract was killed and waited for, and the text comes back
on tesseract's stdout. So every way out (an error, CancelledError, KeyboardInterrupt, an exception
raised by a signal handler) leaves no file behind; only SIGKILL does.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvchat.documents.limits import TextBudget, ocr_scale
from kvchat.errors import DocumentError, raise_if_cancelled

if TYPE_CHECKING:
    from PIL.Image import Image
    from pypdfium2 import PdfPage

TESSERACT = "tesseract"  # the command run, found on PATH
INSTALL_TESSERACT = "sudo apt install tesseract-ocr (Debian, Ubuntu) or brew install tesseract (macOS)"
RENDER_DPI = 300  # tesseract reads best at about 300 dpi; PDF units are 1/72 inch
POLL_S = 0.1  # how often a running tesseract looks at the cancel event
TEMP_PREFIX = "kvchat-ocr-"  # the folder of the page being read, in the system's temporary folder
# progress(done, total): `done` of the `total` pages to OCR are read; called with 0 before the first.
PageProgress = Callable[[int, int], None]


def tesseract_installed() -> bool:
    return shutil.which(TESSERACT) is not None


def _render(path: Path, page: PdfPage, number: int) -> Image:
    """Page `number` (1-based) as a grayscale image at RENDER_DPI, or smaller where that would
    take more pixels than limits.py allows: a page can measure a million points a side."""
    scale = ocr_scale(path, number, page.get_width(), page.get_height(), RENDER_DPI / 72)
    return page.render(scale=scale, grayscale=True).to_pil()


def _ocr_failed(path: Path, number: int, reason: str) -> DocumentError:
    return DocumentError(
        f"{path}: OCR failed on page {number} ({reason})",
        f"check the tesseract installation, or reinstall it: {INSTALL_TESSERACT}",
    )


def _wait(process: subprocess.Popen[bytes], cancel: threading.Event | None) -> tuple[bytes, bytes]:
    """tesseract's (stdout, stderr), looking at `cancel` every POLL_S while it reads."""
    while True:
        try:
            return process.communicate(timeout=None if cancel is None else POLL_S)
        except subprocess.TimeoutExpired:
            raise_if_cancelled(cancel)


def read_image(path: Path, number: int, image: Image, folder: Path, cancel: threading.Event | None = None) -> str:
    """What tesseract reads on `image` (page `number` of `path`), written to `folder` for it.
    Raises CancelledError once `cancel` is set; tesseract is killed and waited for on every way out."""
    source = folder / "page.png"
    image.save(source, format="PNG")
    try:
        process = subprocess.Popen(
            [TESSERACT, str(source), "stdout"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as error:
        raise _ocr_failed(path, number, f"cannot run {TESSERACT}: {error.strerror}") from None
    with process:  # closes its pipes
        try:
            output, errors = _wait(process, cancel)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if process.returncode != 0:
        reason = " ".join(errors.decode("utf-8", "replace").split()) or f"exit status {process.returncode}"
        raise _ocr_failed(path, number, reason)
    return output.decode("utf-8", "replace")


def ocr_pages(
    path: Path,
    data: bytes,
    indices: Sequence[int],
    progress: PageProgress | None = None,
    budget: TextBudget | None = None,
    cancel: threading.Event | None = None,
) -> list[str]:
    """What tesseract reads on each page of the PDF `data` in `indices` (0-based), in that order;
    `budget` counts the text as each page is read. Raises CancelledError once `cancel` is set."""
    import pypdfium2

    report = progress or (lambda done, total: None)
    take = budget.take if budget is not None else str
    raise_if_cancelled(cancel)
    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as error:
        raise DocumentError(f"{path}: cannot render the PDF's pages for OCR ({error})", "is the file complete?") from None
    texts: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as folder:
            report(0, len(indices))
            for index in indices:
                raise_if_cancelled(cancel)
                image = _render(path, pdf[index], index + 1)
                texts.append(take(read_image(path, index + 1, image, Path(folder), cancel)))
                report(len(texts), len(indices))
    finally:
        pdf.close()
    return texts
