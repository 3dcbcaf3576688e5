"""DOCX through python-docx: the body's paragraphs and tables in reading order, headings marked as
Markdown headings ("## Scope") so the model sees the structure, each table row as its cells
joined by " | ". Word lays out pages when it draws the document, so a DOCX is one page of text.

Not read: headers and footers (the same lines on every page), footnotes, comments and text boxes,
which python-docx does not expose in reading order.

python-docx unpacks the zip itself, with ZipFile.read(): the archive's directory is checked and
every member inflated once within the budgets first (archive.py), so what it then reads is bounded.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvchat.documents.archive import Archive
from kvchat.documents.formats import unreadable
from kvchat.documents.limits import TextBudget
from kvchat.documents.model import Document
from kvchat.errors import CancelledError, DocumentError

if TYPE_CHECKING:
    from docx.document import Document as WordDocument
    from docx.table import Table, _Cell
    from docx.text.paragraph import Paragraph

HEADING_STYLE = re.compile(r"Heading ([1-9])")  # Word's built-in heading styles, by their English names


def _heading_level(paragraph: Paragraph) -> int:
    """1 to 9 for a title or heading, 0 for body text."""
    name = (paragraph.style.name if paragraph.style is not None else "") or ""
    if name == "Title":
        return 1
    heading = HEADING_STYLE.fullmatch(name)
    return int(heading.group(1)) if heading else 0


class _WordText:
    """The text of one Word document's blocks. python-docx finds a paragraph's style by scanning
    every style of the document (~2 ms a paragraph: 100,000 paragraphs took minutes), so the
    heading level is looked up once per style (by the paragraph's w:pStyle id), and not at all
    for a paragraph without text."""

    def __init__(self) -> None:
        self._levels: dict[str | None, int] = {}

    def blocks(self, container: WordDocument | _Cell) -> Iterator[str]:
        """The text of each paragraph and table of `container` (the body or a cell), in order; an
        empty paragraph is an empty string."""
        from docx.table import Table

        for block in container.iter_inner_content():
            yield self._table(block) if isinstance(block, Table) else self._paragraph(block)

    def _paragraph(self, paragraph: Paragraph) -> str:
        text = paragraph.text
        if not text.strip():
            return text
        style_id = paragraph._p.style  # python-docx's own XML element: the style's id, None for the default
        if style_id not in self._levels:
            self._levels[style_id] = _heading_level(paragraph)
        level = self._levels[style_id]
        return f"{'#' * level} {text.strip()}" if level else text

    def _cell(self, cell: _Cell) -> str:
        """A cell's paragraphs and nested tables on one line."""
        return " ".join(" ".join(block.split()) for block in self.blocks(cell) if block.strip())

    def _table(self, table: Table) -> str:
        rows = []
        for row in table.rows:
            cells: list[_Cell] = []
            for cell in row.cells:  # a merged cell comes once per grid column it spans: once is enough
                if not cells or cell is not cells[-1]:
                    cells.append(cell)
            rows.append(" | ".join(self._cell(cell) for cell in cells))
        return "\n".join(rows)


def _encrypted(data: bytes) -> bool:
    """Whether `data` is an Office file encrypted with a password (an OLE container, not a zip)."""
    import msoffcrypto
    from msoffcrypto.exceptions import FileFormatError

    try:
        return bool(msoffcrypto.OfficeFile(io.BytesIO(data)).is_encrypted())
    except (FileFormatError, OSError, ValueError, KeyError):
        return False


def _verified_zip(path: Path, data: bytes) -> None:
    """Check the DOCX's zip within the budgets before python-docx unpacks it (DocumentError if not)."""
    try:
        archive = Archive(path, data, "DOCX")
    except DocumentError:
        raise
    except Exception as error:  # not a zip (zipfile.BadZipFile, mostly): a password-protected DOCX is an OLE file
        if _encrypted(data):
            raise DocumentError(
                f"{path}: the DOCX is password-protected",
                "open it with its password in Word or LibreOffice and save a copy without one, then give that",
            ) from None
        raise DocumentError(unreadable(path, "DOCX", error), "is the file complete?") from None
    with archive:
        archive.verify()


def read_docx(path: Path, data: bytes, cancel: threading.Event | None = None) -> Document:
    """The DOCX's paragraphs and tables; `cancel` stops the reading between two of them."""
    import docx  # imported when a DOCX is read, as pypdf is for a PDF: kvchat's start-up stays short

    budget = TextBudget(path, cancel)
    try:
        _verified_zip(path, data)
        word = docx.Document(io.BytesIO(data))
        text = "\n\n".join(block for block in map(budget.take, _WordText().blocks(word)) if block.strip())
    except (DocumentError, CancelledError):
        raise
    except Exception as error:  # a damaged zip or XML part raises many types
        raise DocumentError(unreadable(path, "DOCX", error), "is the file complete?") from None
    return Document.from_pages(path, "docx", [text])
