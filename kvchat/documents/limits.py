"""The budgets an untrusted document is read within, in one place: the CLI, the TUI and the server
all read through load_document, so they all refuse the same files with the same line.

Each budget is checked while the document is read, not after: a zip's directory before anything
is inflated and each member as it inflates (archive.py), the text and the pages as each page is
extracted, the pixels of a page before it is rendered for OCR. Exceeding one is a DocumentError
that names the limit, with a hint.

The defaults leave room far beyond the largest real documents measured (docs/cli.md); the server's
upload limit is the file limit (ServerLimits.max_body_bytes defaults to MAX_FILE_BYTES).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

from kvchat.errors import DocumentError, raise_if_cancelled

MAX_FILE_BYTES = 64 * 2**20  # bytes read from one file: the server's upload limit
MAX_ARCHIVE_MEMBERS = 10_000  # files in a DOCX or EPUB (real ones: tens; an illustrated book: hundreds)
MAX_MEMBER_BYTES = 64 * 2**20  # one member unpacked: as much as the file itself holds (images are stored ~1 to 1)
MAX_ARCHIVE_BYTES = 128 * 2**20  # all members unpacked, and all that reading a DOCX or EPUB inflates
MAX_COMPRESSION_RATIO = 200  # unpacked : packed size of a member, checked for members over RATIO_FLOOR_BYTES
RATIO_FLOOR_BYTES = 2**20  # small members may compress as they like: they cannot add up to much
MAX_TEXT_CHARS = 16 * 2**20  # characters of text from one document: ~4M tokens, 4 times the whole Bible
MAX_PAGES = 10_000  # pages of a PDF, chapters of an EPUB (the thickest manuals have ~5,000 pages)
MAX_OCR_PIXELS = 36_000_000  # a page rendered for OCR: ~A2 at 300 dpi; larger pages render at a lower dpi
MAX_OCR_SIDE = 32_767  # pixels on either side of that image: the most tesseract takes
MAX_MARKUP_TAGS = 1_000_000  # in an HTML file or an EPUB chapter: a long book has tens of thousands
MAX_MARKUP_DEPTH = 512  # elements nested in one another: Chromium's HTML parser stops nesting there too
SERVER_DOCUMENTS_BYTES = 2**30  # memory a server keeps uploaded documents in: 15 or more of the most text each

ZIP_BOMB_HINT = (
    "real documents unpack to far less: is the file what it claims to be? If it is, "
    "save it again from its application, or convert it to PDF"
)
SPLIT_HINT = "split it into smaller documents, or give only the part you need"


def size_text(size: float) -> str:
    """Bytes as people read them: '64 MiB', '2,048.5 MiB', '512 bytes'."""
    if size < 2**20:
        return f"{size:,.0f} bytes"
    mib = size / 2**20
    return f"{mib:,.0f} MiB" if mib == int(mib) else f"{mib:,.1f} MiB"


def check_file_size(path: Path, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise DocumentError(
            f"{path}: the file is {size_text(size)}, over the limit of {size_text(MAX_FILE_BYTES)} for a document",
            SPLIT_HINT,
        )


def check_pages(path: Path, count: int, kind: str, unit: str = "pages") -> None:
    """Refuse a document of more than MAX_PAGES pages (`unit`: an EPUB counts chapters)."""
    if count > MAX_PAGES:
        raise DocumentError(
            f"{path}: the {kind} has {count:,} {unit}, over the limit of {MAX_PAGES:,} {unit}", SPLIT_HINT
        )


class TextBudget:
    """The characters of text a reader has taken from one document so far, refused past
    MAX_TEXT_CHARS as each page or block comes: a document that would extract gigabytes of text
    stops at the limit instead of after. Each page or block is also where the reading stops once
    `cancel` is set (the user pressed Ctrl-C or esc, the client left, the server stops)."""

    def __init__(self, path: Path, cancel: threading.Event | None = None) -> None:
        self.path = path
        self.cancel = cancel
        self.limit = MAX_TEXT_CHARS
        self.chars = 0

    def take(self, text: str) -> str:
        """`text`, counted; raises DocumentError once the document's text is over the limit, and
        CancelledError once `cancel` is set."""
        raise_if_cancelled(self.cancel)
        self.chars += len(text)
        if self.chars > self.limit:
            raise DocumentError(
                f"{self.path}: the document has more than {self.limit:,} characters of text, the limit for a document",
                SPLIT_HINT,
            )
        return text


def ocr_scale(path: Path, number: int, width_pt: float, height_pt: float, scale: float) -> float:
    """The scale to render page `number` (1-based) of `width_pt` x `height_pt` at for OCR: `scale`
    (300 dpi), or less where that would take more than MAX_OCR_PIXELS or MAX_OCR_SIDE on a side.
    A page that fits only below one pixel on a side (a strip a million points long) is refused."""
    if not (math.isfinite(width_pt) and math.isfinite(height_pt)) or width_pt <= 0 or height_pt <= 0:
        raise DocumentError(
            f"{path}: page {number} of the PDF has no usable size ({width_pt} x {height_pt} pt)", "is the file complete?"
        )
    # PDFium makes the image ceil(size x scale) pixels: a side one pixel short leaves room for the rounding up
    longest = max(width_pt, height_pt)
    scale = min(scale, math.sqrt(MAX_OCR_PIXELS / (width_pt * height_pt)), (MAX_OCR_SIDE - 1) / longest)
    if min(width_pt, height_pt) * scale < 1:
        raise DocumentError(
            f"{path}: page {number} of the PDF is {width_pt:,.0f} x {height_pt:,.0f} pt, too large to render for OCR "
            f"within the limits of {MAX_OCR_PIXELS:,} pixels and {MAX_OCR_SIDE:,} pixels a side",
            "give a PDF whose scanned pages have the size of paper",
        )
    return scale
