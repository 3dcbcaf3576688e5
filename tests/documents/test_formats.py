"""DOCX, EPUB and scanned PDFs, each made by its own library: what is read, in which order, on which
page; and the one-line error for an empty, corrupt or protected file."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import docx
import pytest
from ebooklib import epub
from msoffcrypto.format.ooxml import OOXMLFile
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter
from rich.console import Console

from kvchat.cli.render import OcrBar
from kvchat.documents import DOCUMENT_SUFFIXES, SUPPORTED, load_document
from kvchat.errors import DocumentError
from tests.system_tools import system_tool
from tests.documents.test_normalize import make_text_pdf

# ---- DOCX ------------------------------------------------------------------------------------


def make_docx(path: Path) -> Path:
    """A title, headings, paragraphs, and a table between them with a cell merged across two columns."""
    document = docx.Document()
    document.add_heading("Expedition Report", level=0)
    document.add_heading("The boat", level=1)
    document.add_paragraph("The expedition left the harbour on the boat called Grey Heron.")
    table = document.add_table(rows=3, cols=3)
    for row, cells in zip(table.rows, [("Item", "Cost", "Paid by"), ("Fuel", "1,200 euros", "the club"), ("Food", "", "")]):
        for cell, text in zip(row.cells, cells):
            cell.text = text
    table.cell(2, 1).merge(table.cell(2, 2)).text = "3,150 euros, shared"
    document.add_heading("The budget", level=2)
    document.add_paragraph("The whole trip cost 4,350 euros.")
    document.add_paragraph("")  # an empty paragraph: spacing, not text
    document.save(path)
    return path


def encrypt_docx(plain: Path, path: Path, password: str = "secret") -> Path:
    """`plain` encrypted as Word encrypts with a password (an OLE container, not a zip)."""
    with plain.open("rb") as source, path.open("wb") as target:
        OOXMLFile(source).encrypt(password, target)
    return path


def test_docx_paragraphs_tables_and_headings_in_reading_order(tmp_path: Path) -> None:
    document = load_document(make_docx(tmp_path / "report.docx"))
    assert document.kind == "docx"
    assert document.text == (
        "# Expedition Report\n\n"
        "# The boat\n\n"
        "The expedition left the harbour on the boat called Grey Heron.\n\n"
        "Item | Cost | Paid by\n"
        "Fuel | 1,200 euros | the club\n"
        "Food | 3,150 euros, shared\n\n"
        "## The budget\n\n"
        "The whole trip cost 4,350 euros."
    )
    assert [(page.number, page.start, page.end) for page in document.pages] == [(1, 0, len(document.text))]


def test_a_docx_style_is_looked_up_once_not_for_every_paragraph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """python-docx scans every style to find one: 100,000 empty paragraphs (a 37 KB file) took
    minutes when each paragraph's style was looked up."""
    from kvchat.documents import docx as docx_module

    word = docx.Document()
    word.add_heading("Terms", level=1)
    for number in range(2000):
        word.add_paragraph("" if number % 2 else f"Clause {number}.")
    path = tmp_path / "many.docx"
    word.save(str(path))
    looked_up = []
    heading_level = docx_module._heading_level
    monkeypatch.setattr(docx_module, "_heading_level", lambda paragraph: looked_up.append(paragraph.text) or heading_level(paragraph))
    text = load_document(path).text
    assert text.startswith("# Terms\n\nClause 0.\n\nClause 2.") and text.count("Clause") == 1000
    assert looked_up == ["Terms", "Clause 0."]  # once for the heading style, once for the default one


def test_docx_text_is_normalized(tmp_path: Path) -> None:
    word = docx.Document()
    word.add_paragraph("Fee\u00a0of\u00a0\u00a0ten\u00a0dollars, non\u2011refundable.")
    word.save(tmp_path / "fee.docx")
    assert load_document(tmp_path / "fee.docx").text == "Fee of ten dollars, non-refundable."


# ---- EPUB ------------------------------------------------------------------------------------

CHAPTERS = [  # (file, title in the table of contents, body); the third has no heading of its own
    ("harbour.xhtml", "The Harbour", "<h1>The Harbour</h1><p>The boat was called Grey Heron.</p>"),
    ("budget.xhtml", "The Budget", "<h2>The Budget</h2><p>The trip cost 4,350 euros.</p>"),
    ("return.xhtml", "The Return", "<p>They came home on the ninth of May.</p>"),
]


def make_epub(path: Path, chapters: list[tuple[str, str, str]] = CHAPTERS) -> Path:
    """An EPUB 3 whose spine is: the table of contents, a cover that is only an image, then the
    chapters, added to the book in reverse so that only the spine gives their order."""
    book = epub.EpubBook()
    book.set_identifier("kvchat-test-book")
    book.set_title("The Expedition")
    book.set_language("en")
    image = io.BytesIO()
    Image.new("RGB", (8, 8), "navy").save(image, "PNG")
    book.add_item(epub.EpubItem(uid="cover-image", file_name="cover.png", media_type="image/png", content=image.getvalue()))
    cover = epub.EpubHtml(title="Cover", file_name="cover.xhtml", content='<img src="cover.png" alt=""/>')
    items = [epub.EpubHtml(title=title, file_name=name, lang="en", content=body) for name, title, body in chapters]
    for item in [cover, *reversed(items)]:
        book.add_item(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", cover, *items]
    epub.write_epub(path, book)
    return path


def rewrite_zip(path: Path, changes: dict[str, bytes]) -> Path:
    """The zip at `path` with some entries replaced or added (the mimetype stays first, stored)."""
    with zipfile.ZipFile(path) as source:
        entries = {info.filename: (info, source.read(info)) for info in source.infolist()}
    with zipfile.ZipFile(path, "w") as target:
        for name, (info, data) in entries.items():
            target.writestr(info, changes.pop(name, data))
        for name, data in changes.items():
            target.writestr(name, data, zipfile.ZIP_DEFLATED)
    return path


def encryption_xml(algorithm: str, uri: str) -> bytes:
    return (
        '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
        'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
        f'<enc:EncryptionMethod Algorithm="{algorithm}"/>'
        f'<enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData>'
        "</enc:EncryptedData></encryption>"
    ).encode()


def make_drm_epub(path: Path) -> Path:
    """The book as DRM leaves it: encryption.xml lists a chapter, whose bytes are ciphertext."""
    make_epub(path)
    return rewrite_zip(path, {
        "META-INF/encryption.xml": encryption_xml("http://www.w3.org/2001/04/xmlenc#aes128-cbc", "EPUB/harbour.xhtml"),
        "EPUB/harbour.xhtml": os.urandom(512),
    })


def test_epub_chapters_are_pages_in_spine_order(tmp_path: Path) -> None:
    document = load_document(make_epub(tmp_path / "book.epub"))
    assert document.kind == "epub"
    pages = [document.text[page.start : page.end] for page in document.pages]
    assert pages == [
        "The Harbour\n\nThe boat was called Grey Heron.",
        "The Budget\n\nThe trip cost 4,350 euros.",
        "The Return\n\nThey came home on the ninth of May.",  # its title from the table of contents
    ]
    assert [page.number for page in document.pages] == [1, 2, 3]
    assert document.text == "\n\n".join(pages)
    assert document.page_at(document.text.index("4,350")) == 2
    assert document.page_at(document.text.index("The Return")) == 3


def test_epub_font_obfuscation_is_not_drm(tmp_path: Path) -> None:
    """EPUBs may obfuscate embedded fonts (IDPF's algorithm, undone with the book's id): still read."""
    path = rewrite_zip(make_epub(tmp_path / "book.epub"), {
        "META-INF/encryption.xml": encryption_xml("http://www.idpf.org/2008/embedding", "EPUB/fonts/serif.otf"),
        "EPUB/fonts/serif.otf": os.urandom(256),
    })
    assert "Grey Heron" in load_document(path).text


# ---- scanned PDFs ------------------------------------------------------------------------------

SCANNED_LINES = ["The expedition left the harbour on the boat", "called Grey Heron. The whole trip", "cost 4,350 euros."]


def make_scanned_pdf(path: Path, lines: list[str] = SCANNED_LINES) -> Path:
    """A page of text drawn as an image (Pillow), saved as an image-only PDF: no text layer."""
    image = Image.new("L", (1275, 1650), 255)  # US Letter at 150 dpi
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=36)
    for number, line in enumerate(lines):
        draw.text((120, 150 + 60 * number), line, fill=0, font=font)
    image.save(path, "PDF", resolution=150)
    return path


def make_mixed_pdf(path: Path) -> Path:
    """Page 1 with a text layer, page 2 scanned."""
    writer = PdfWriter()
    writer.append(make_text_pdf(path.with_suffix(".text.pdf"), [["Clause 1. The parties agree."]]))
    writer.append(make_scanned_pdf(path.with_suffix(".scan.pdf")))
    writer.write(path)
    return path


@pytest.fixture
def tesseract() -> None:
    system_tool("tesseract", "tesseract-ocr")


@pytest.fixture
def no_tesseract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No tesseract to be found: PATH holds an empty folder only. Returns that environment."""
    empty = tmp_path / "no-tesseract"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return dict(os.environ)


@pytest.mark.system
def test_scanned_pdf_is_read_by_ocr_with_progress(tesseract: None, tmp_path: Path) -> None:
    reports: list[tuple[int, int]] = []
    document = load_document(make_scanned_pdf(tmp_path / "scan.pdf"), progress=lambda done, total: reports.append((done, total)))
    assert document.kind == "pdf" and len(document.pages) == 1
    assert document.text == "The expedition left the harbour on the boat\ncalled Grey Heron. The whole trip\ncost 4,350 euros."
    assert reports == [(0, 1), (1, 1)]


@pytest.mark.system
def test_only_pages_without_a_text_layer_are_ocrd(tesseract: None, tmp_path: Path) -> None:
    path = make_mixed_pdf(tmp_path / "mixed.pdf")
    assert [page.extract_text().strip() for page in PdfReader(path).pages] == ["Clause 1. The parties agree.", ""]
    reports: list[tuple[int, int]] = []
    document = load_document(path, progress=lambda done, total: reports.append((done, total)))
    first, second = (document.text[page.start : page.end] for page in document.pages)
    assert first == "Clause 1. The parties agree."
    assert "Grey Heron" in second and "4,350 euros" in second
    assert reports == [(0, 1), (1, 1)]  # one page OCR'd, not two


def test_without_tesseract_a_scanned_pdf_names_the_install_command(no_tesseract: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(DocumentError) as info:
        load_document(make_scanned_pdf(tmp_path / "scan.pdf"))
    line = info.value.one_line()
    assert "\n" not in line
    assert "no extractable text" in line and "tesseract, which is not installed" in line
    assert "sudo apt install tesseract-ocr" in line and "brew install tesseract" in line


def test_without_tesseract_the_text_layer_is_still_read(no_tesseract: dict[str, str], tmp_path: Path) -> None:
    document = load_document(make_mixed_pdf(tmp_path / "mixed.pdf"))
    assert document.text == "Clause 1. The parties agree."


def test_ocr_progress_bar() -> None:
    output = io.StringIO()
    with OcrBar(Console(file=output, force_terminal=True, width=100)) as progress:
        progress(0, 3)
        progress(2, 3)
    assert "OCR" in output.getvalue() and "2/3 pages" in output.getvalue()


# ---- refused, with one line each -------------------------------------------------------------------


MakeFile = Callable[[Path], Path]


def _truncated(make: MakeFile, name: str) -> MakeFile:
    """The first half of the file `make` writes."""
    def truncate(folder: Path) -> Path:
        path = make(folder / name)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    return truncate


def _file(name: str, data: bytes) -> MakeFile:
    def write(folder: Path) -> Path:
        (folder / name).write_bytes(data)
        return folder / name
    return write


BAD_FILES: dict[str, tuple[MakeFile, str]] = {
    "docx-zero-bytes": (_file("x.docx", b""), "the file is empty"),
    "docx-no-text": (lambda p: docx.Document().save(p / "blank.docx") or p / "blank.docx", "no text in the document"),
    "docx-corrupt": (_truncated(make_docx, "broken.docx"), "not a readable docx"),
    "docx-not-a-zip": (_file("x.docx", b"just text"), "not a readable docx"),
    "docx-password-protected": (lambda p: encrypt_docx(make_docx(p / "plain.docx"), p / "locked.docx"), "password-protected"),
    "epub-zero-bytes": (_file("x.epub", b""), "the file is empty"),
    "epub-no-text": (lambda p: make_epub(p / "blank.epub", [("blank.xhtml", "Blank", "<p> </p>")]), "no text in the document"),
    "epub-corrupt": (_truncated(make_epub, "broken.epub"), "not a readable epub"),
    "epub-drm-protected": (lambda p: make_drm_epub(p / "locked.epub"), "drm-protected"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_files_raise_one_line_document_errors(kind: str, tmp_path: Path) -> None:
    make, expected = BAD_FILES[kind]
    with pytest.raises(DocumentError) as info:
        load_document(make(tmp_path))
    assert expected in info.value.message.lower()
    assert info.value.hint and "\n" not in info.value.one_line()


@pytest.mark.system
@pytest.mark.parametrize("kind", ["docx-password-protected", "epub-corrupt", "scanned-without-tesseract"])
def test_kvchat_ask_exits_2_with_one_line(kind: str, tmp_path: Path, isolated_home: Path) -> None:
    """Through the command a person runs: the document is refused before any model loads."""
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    if kind == "scanned-without-tesseract":
        path, expected = make_scanned_pdf(tmp_path / "scan.pdf"), "sudo apt install tesseract-ocr"
        (tmp_path / "bin").mkdir()
        env["PATH"] = str(tmp_path / "bin")
    else:
        make, expected = BAD_FILES[kind]
        path = make(tmp_path)
    result = subprocess.run([sys.executable, "-m", "kvchat.cli", "ask", str(path), "Who pays?"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"kvchat: error: {path}: ") and "(hint: " in line and expected in line.lower()


def test_formats_are_named_and_offered() -> None:
    assert {".docx", ".epub", ".pdf"} <= DOCUMENT_SUFFIXES
    assert "DOCX" in SUPPORTED and "EPUB" in SUPPORTED
