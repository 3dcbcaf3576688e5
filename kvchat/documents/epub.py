"""EPUB through EbookLib: one page per chapter, in the spine's reading order.

A chapter is a document of the spine that has text (not the table of contents, not a cover that is
only an image), numbered from 1 in that order; its XHTML becomes text through inscriptis, like any
HTML. The title the table of contents gives it starts its page, unless its own text already does.

EbookLib reads every file of the manifest as it loads the book: its reads go through an Archive
(archive.py), which checks the zip's directory first and counts what each read inflates.
"""

from __future__ import annotations

import io
import posixpath
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote
from xml.etree import ElementTree

from kvchat.documents.archive import Archive
from kvchat.documents.formats import unreadable
from kvchat.documents.limits import TextBudget, check_pages
from kvchat.documents.markup import markup_text
from kvchat.documents.model import Document
from kvchat.documents.text import decode_text
from kvchat.errors import DocumentError, raise_if_cancelled

if TYPE_CHECKING:
    from ebooklib.epub import EpubBook

ENCRYPTION = "META-INF/encryption.xml"
# The algorithms that only obfuscate embedded fonts (with the book's own id, which readers undo):
# the IDPF's and Adobe's. Anything else encrypted is DRM.
FONT_OBFUSCATION = frozenset({"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"})


def _drm_protected(archive: Archive) -> bool:
    """Whether the book's encryption.xml encrypts anything with more than font obfuscation."""
    if ENCRYPTION not in archive.namelist():
        return False
    root = ElementTree.fromstring(archive.read(ENCRYPTION))
    methods = (element.get("Algorithm", "") for element in root.iter() if element.tag.endswith("}EncryptionMethod"))
    return any(method not in FONT_OBFUSCATION for method in methods)


def _toc_titles(entries: Iterable[object], titles: dict[str, str]) -> dict[str, str]:
    """Each file's first title in the table of contents (EbookLib's Links, and (Section, children)
    pairs), by the file's name in the manifest."""
    for entry in entries:
        if isinstance(entry, (tuple, list)):
            _toc_titles(entry, titles)
        elif getattr(entry, "href", None) and getattr(entry, "title", None):
            titles.setdefault(unquote(entry.href.split("#", 1)[0]), entry.title.strip())
    return titles


def _chapters(path: Path, book: EpubBook, cancel: threading.Event | None) -> list[str]:
    from ebooklib import ITEM_DOCUMENT
    from ebooklib.epub import EpubNav

    check_pages(path, len(book.spine), "EPUB", "chapters")
    titles = _toc_titles(book.toc, {})
    budget = TextBudget(path, cancel)
    chapters = []
    for idref, _linear in book.spine:
        raise_if_cancelled(cancel)
        item = book.get_item_with_id(idref)
        if item is None or isinstance(item, EpubNav) or item.get_type() != ITEM_DOCUMENT:
            continue
        # the chapter's file as it is: EpubHtml.get_content() parses it again within libxml2's
        # defaults, which drop text nested deeper than 256 or over 10 MB in one piece without a word
        text = markup_text(path, decode_text(path, item.content or b"", item.file_name), item.file_name).strip()
        title = titles.get(item.file_name, "")
        if text and title and not " ".join(text.split()).startswith(" ".join(title.split())):
            text = f"{title}\n\n{text}"
        if text:
            chapters.append(budget.take(text))
    return chapters


def _load(archive: Archive, data: bytes) -> EpubBook:
    """The book as epub.read_epub loads it, but with every file read through `archive`."""
    from ebooklib import epub  # imported when an EPUB is read, as pypdf is for a PDF

    class BoundedReader(epub.EpubReader):
        def read_file(self, name: str) -> bytes:
            return archive.read(posixpath.normpath(name))  # EbookLib's own read_file normalizes so

    reader = BoundedReader(io.BytesIO(data), {"ignore_ncx": True})
    book = reader.load()
    reader.process()
    return book


def read_epub(path: Path, data: bytes, cancel: threading.Event | None = None) -> Document:
    """The EPUB's chapters in reading order; `cancel` stops the reading between two of them."""
    try:
        with Archive(path, data, "EPUB") as archive:
            protected = _drm_protected(archive)
            book = None if protected else _load(archive, data)
    except DocumentError:
        raise
    except Exception as error:  # a damaged zip, package file or XML raises many types
        raise DocumentError(unreadable(path, "EPUB", error), "is the file complete?") from None
    if book is None:
        raise DocumentError(
            f"{path}: the EPUB is DRM-protected (its chapters are encrypted)",
            "kvchat cannot decrypt it: give a DRM-free copy of the book",
        )
    return Document.from_pages(path, "epub", _chapters(path, book, cancel))
