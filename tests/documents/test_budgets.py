"""Hostile documents: zip bombs, huge PDF pages and endless text, each refused with one line that
names the limit (kvchat/documents/limits.py) before it costs what it would. The bombs are made
here, small on disk: a member's deflate stream is one compressed chunk repeated, so a 2 GiB member
takes 2 MB and no time to write."""

from __future__ import annotations

import io
import struct
import tempfile
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docx
import pytest
from ebooklib import epub
from pypdf import PdfWriter
from pypdf.generic import FloatObject, NameObject, RectangleObject

from kvchat.documents import archive as archive_module
from kvchat.documents import limits, load_document
from kvchat.documents import ocr as ocr_module
from kvchat.documents import pdf as pdf_module
from kvchat.documents.limits import MAX_MARKUP_DEPTH, MAX_MARKUP_TAGS
from kvchat.errors import DocumentError
from kvchat.server.documents import DocumentLibrary
from tests.documents.test_normalize import make_text_pdf

MIB = 2**20
SPACES = b" " * MIB
ZIP_BOMB = "(a zip bomb?) (hint: real documents unpack to far less"
LONGEST_CUAD = Path(__file__).parents[2] / "kvchat" / "bench" / "data" / "cuad" / "cuad_manufacturers_services_outsourcing.txt"

# ---- zips written by hand: members that declare what the test wants --------------------------------


@dataclass(frozen=True)
class Member:
    name: str
    raw: bytes  # as stored in the archive
    size: int  # unpacked, as the directory declares it
    crc: int
    method: int = zipfile.ZIP_DEFLATED

    def declaring(self, size: int, crc: int | None = None) -> Member:
        """The same bytes under a directory entry that lies about their size (and CRC)."""
        return Member(self.name, self.raw, size, self.crc if crc is None else crc, self.method)


def deflated(name: str, parts: Sequence[tuple[bytes, int]]) -> Member:
    """Each (data, times) of `parts` in order, deflated: each data compressed once and its copies
    repeated (a full flush after each makes them the same bytes)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    raw, size, crc = [], 0, 0
    for data, times in parts:
        raw.append((compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)) * times)
        size += len(data) * times
        for _ in range(times):
            crc = zlib.crc32(data, crc)
    raw.append(compressor.flush())
    return Member(name, b"".join(raw), size, crc)


def stored(name: str, data: bytes) -> Member:
    return Member(name, data, len(data), zlib.crc32(data), zipfile.ZIP_STORED)


def write_zip(path: Path, members: Sequence[Member]) -> Path:
    """A zip of `members`, their local headers and directory entries declaring what each says."""
    local, central, offset = [], [], 0
    for member in members:
        name = member.name.encode()
        sizes = (member.crc, len(member.raw), member.size, len(name))
        header = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, member.method, 0, 0x21, *sizes, 0) + name
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, member.method, 0, 0x21, *sizes,
                                   0, 0, 0, 0, 0, offset) + name)
        local.append(header + member.raw)
        offset += len(header) + len(member.raw)
    directory = b"".join(central)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory), offset, 0)
    path.write_bytes(b"".join(local) + directory + end)
    return path


def _one_paragraph_docx() -> list[Member]:
    out = io.BytesIO()
    word = docx.Document()
    word.add_paragraph("The boat was called Grey Heron.")
    word.save(out)
    with zipfile.ZipFile(out) as made:
        return [deflated(info.filename, [(made.read(info), 1)]) for info in made.infolist()]


DOCX_MEMBERS = _one_paragraph_docx()
DOCX_BYTES = sum(member.size for member in DOCX_MEMBERS)  # unpacked


def make_docx(path: Path, replace: dict[str, Member] | None = None, add: Sequence[Member] = ()) -> Path:
    """A one-paragraph DOCX by python-docx, with some members replaced or added."""
    replace = replace or {}
    return write_zip(path, [replace.get(member.name, member) for member in DOCX_MEMBERS] + list(add))


CONTAINER = (b'<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
             b'<rootfiles><rootfile full-path="content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
CHAPTER = '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>c</title></head><body>{}</body></html>'


def package(items: Sequence[tuple[str, str, str]], spine: Sequence[str]) -> bytes:
    """An EPUB 3 package file: `items` (id, href, media type) in the manifest, `spine` the ids read."""
    manifest = "".join(f'<item id="{id_}" href="{href}" media-type="{media}"/>' for id_, href, media in items)
    refs = "".join(f'<itemref idref="{id_}"/>' for id_ in spine)
    return ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
            '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">kvchat-test</dc:identifier>'
            '<dc:title>The Expedition</dc:title><dc:language>en</dc:language></metadata>'
            f'<manifest>{manifest}</manifest><spine>{refs}</spine></package>').encode()


def make_epub(path: Path, chapters: Sequence[str], extra_items: Sequence[tuple[str, str, str]] = (),
              add: Sequence[Member] = ()) -> Path:
    """An EPUB whose spine reads `chapters` (each a body of XHTML) in order; `extra_items` are listed
    in the manifest too, `add` are more files in the zip."""
    items = [(f"c{n}", f"c{n}.xhtml", "application/xhtml+xml") for n in range(len(chapters))]
    members = [stored("mimetype", b"application/epub+zip"), deflated("META-INF/container.xml", [(CONTAINER, 1)]),
               deflated("content.opf", [(package([*items, *extra_items], [id_ for id_, _, _ in items]), 1)])]
    members += [deflated(href, [(CHAPTER.format(body).encode(), 1)]) for (_, href, _), body in zip(items, chapters)]
    return write_zip(path, [*members, *add])


def refused(path: Path) -> tuple[str, int]:
    """The one line load_document refuses `path` with, and the peak of Python's memory meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError) as info:
            load_document(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    line = info.value.one_line()
    assert "\n" not in line and info.value.hint
    return line, peak


# ---- zip bombs -------------------------------------------------------------------------------------

WORD = "word/document.xml"
PARAGRAPHS = b"<w:p/>" * (MIB // 6)  # ~1 MiB of empty paragraphs


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: make_docx(p / "ws.docx", {WORD: deflated(WORD, [(SPACES, 2048)])}),
         "part 'word/document.xml' of the DOCX unpacks to 2,048 MiB, over the limit of 64 MiB for one part"),
        (lambda p: make_docx(p / "p.docx", {WORD: deflated(WORD, [(b"<w:body>", 1), (PARAGRAPHS, 60), (b"</w:body>", 1)])}),
         "part 'word/document.xml' of the DOCX is compressed 675 to 1, over the limit of 200 to 1"),
        (lambda p: make_docx(p / "many.docx", add=[deflated(f"word/media/m{n}.bin", [(SPACES, 1)]) for n in range(128)]),
         f"the DOCX unpacks to {limits.size_text(128 * MIB + DOCX_BYTES)}, over the limit of 128 MiB for an archive"),
        (lambda p: make_docx(p / "files.docx", add=[stored(f"f{n}", b"") for n in range(10_001 - len(DOCX_MEMBERS))]),
         "the DOCX holds 10,001 files, over the limit of 10,000 for an archive"),
        (lambda p: make_epub(p / "image.epub", ["<p>The boat was called Grey Heron.</p>"],
                             add=[deflated("cover.png", [(bytes(MIB), 2048)])]),  # listed nowhere
         "part 'cover.png' of the EPUB unpacks to 2,048 MiB, over the limit of 64 MiB for one part"),
        (lambda p: make_epub(p / "manifest.epub", ["<p>The boat was called Grey Heron.</p>"],
                             [(f"i{n}", "big.png", "image/png") for n in range(100)], [deflated("big.png", [(SPACES, 64)])]),
         "part 'big.png' of the EPUB is compressed 1,010 to 1, over the limit of 200 to 1"),
    ],
    ids=["docx-whitespace-2g", "docx-paragraphs", "docx-members-add-up", "docx-10001-files", "epub-unlisted-2g-image",
         "epub-manifest-lists-64m-100-times"],
)
def test_a_zip_bomb_is_refused_from_its_directory_before_anything_is_inflated(
    make: Callable[[Path], Path], expected: str, tmp_path: Path
) -> None:
    path = make(tmp_path)
    line, peak = refused(path)
    assert line.startswith(f"{path}: {expected} {ZIP_BOMB}")
    assert path.stat().st_size < 3 * MIB and peak < path.stat().st_size + 8 * MIB  # the file and its directory, nothing inflated


def test_reading_the_same_member_again_and_again_is_counted(tmp_path: Path) -> None:
    """A manifest that lists one member (1 MiB, under the ratio's floor) 2,000 times: 2 GiB of reads,
    refused once they pass MAX_ARCHIVE_BYTES."""
    items = [(f"i{n}", "big.png", "image/png") for n in range(2000)]
    path = make_epub(tmp_path / "manifest.epub", ["<p>The boat was called Grey Heron.</p>"], items, [deflated("big.png", [(SPACES, 1)])])
    line, peak = refused(path)
    assert line.startswith(f"{path}: reading the EPUB unpacks more than 128 MiB, the limit for an archive {ZIP_BOMB}")
    assert peak < limits.MAX_ARCHIVE_BYTES + 32 * MIB  # what was read before the limit; not the 2 GiB


@pytest.mark.parametrize("kind", ["docx", "epub"])
def test_a_member_that_inflates_past_its_declared_size_stops_there(kind: str, tmp_path: Path) -> None:
    """200 MiB of whitespace declared as 1,000 bytes: ZipFile.read() would inflate all 200 MiB
    before its CRC check; read in chunks it stops at 1,001 bytes, and the CRC refuses it."""
    bomb = deflated("word/document.xml" if kind == "docx" else "c0.xhtml", [(SPACES, 200)]).declaring(1000)
    if kind == "docx":
        path = make_docx(tmp_path / "lie.docx", {bomb.name: bomb})
    else:
        path = write_zip(tmp_path / "lie.epub", [*_members(make_epub(tmp_path / "book.epub", ["<p>x</p>"]), bomb.name), bomb])
    line, peak = refused(path)
    assert line == f"{path}: not a readable {kind.upper()} (Bad CRC-32 for file '{bomb.name}') (hint: is the file complete?)"
    assert peak < 8 * MIB


def test_a_lie_with_a_forged_crc_is_refused_by_the_count(tmp_path: Path) -> None:
    """The CRC forged to match what a reader that trusts the declared size would see one byte on:
    the count of inflated bytes refuses it."""
    bomb = deflated(WORD, [(SPACES, 200)]).declaring(1000, crc=zlib.crc32(b" " * 1001))
    path = make_docx(tmp_path / "forged.docx", {WORD: bomb})
    line, peak = refused(path)
    assert line.startswith(f"{path}: part 'word/document.xml' of the DOCX unpacks to more than the 1,000 bytes "
                           f"its directory declares {ZIP_BOMB}")
    assert peak < 8 * MIB


def test_only_stored_and_deflated_members_are_inflated(tmp_path: Path) -> None:
    """bzip2 and LZMA members inflate a whole chunk at once: no DOCX or EPUB uses them."""
    data = zlib.compress(b"x")  # any bytes: the method is refused before they are read
    path = make_docx(tmp_path / "bz.docx", add=[Member("word/media/x.bin", data, 1, 0, zipfile.ZIP_BZIP2)])
    line, _ = refused(path)
    assert line.startswith(f"{path}: not a readable DOCX (part 'word/media/x.bin' is compressed with method 12, "
                           "not stored or deflated as in every DOCX and EPUB)")


def _members(path: Path, without: str) -> list[Member]:
    """The members of the zip at `path`, re-deflated, but `without` one."""
    with zipfile.ZipFile(path) as made:
        return [stored(i.filename, made.read(i)) if i.compress_type == zipfile.ZIP_STORED else deflated(i.filename, [(made.read(i), 1)])
                for i in made.infolist() if i.filename != without]


def test_the_server_refuses_a_bomb_with_the_clients_name_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uploads are read by load_document too: the same limits, the same line."""
    bomb = make_docx(tmp_path / "bomb.docx", {WORD: deflated(WORD, [(SPACES, 2048)])}).read_bytes()
    uploads = tmp_path / "tmp"
    uploads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(uploads))
    with pytest.raises(DocumentError) as info:
        DocumentLibrary().add("report [final].docx", bomb, count_tokens=len)
    assert info.value.message.startswith("report [final].docx: part 'word/document.xml' of the DOCX unpacks to 2,048 MiB")
    assert list(uploads.iterdir()) == []


# ---- text, pages, file size ------------------------------------------------------------------------


@pytest.fixture
def small_text_budget(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(limits, "MAX_TEXT_CHARS", 1000)
    return 1000


def _text_pages(path: Path, pages: int) -> Path:
    return make_text_pdf(path, [[f"Page {n}: " + "The boat was called Grey Heron. " * 9] for n in range(pages)])


TOO_MUCH_TEXT: dict[str, Callable[[Path], Path]] = {
    "txt": lambda p: (p / "long.txt").write_text("Grey Heron. " * 100) and p / "long.txt",
    "html": lambda p: (p / "long.html").write_text("<p>" + "Grey Heron. " * 100 + "</p>") and p / "long.html",
    "docx": lambda p: make_docx(p / "long.docx", {WORD: _docx_body(["Grey Heron. " * 30] * 4)}),
    "epub": lambda p: make_epub(p / "long.epub", ["<p>" + "Grey Heron. " * 30 + "</p>"] * 4),
    "pdf": lambda p: _text_pages(p / "long.pdf", 10),
}


def _docx_body(paragraphs: Sequence[str]) -> Member:
    body = "".join(f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>" for text in paragraphs)
    xml = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document '
           'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
           f"<w:body>{body}</w:body></w:document>")
    return deflated(WORD, [(xml.encode(), 1)])


@pytest.mark.parametrize("kind", sorted(TOO_MUCH_TEXT))
def test_text_over_the_budget_is_refused(kind: str, small_text_budget: int, tmp_path: Path) -> None:
    path = TOO_MUCH_TEXT[kind](tmp_path)
    line, _ = refused(path)
    assert line == (f"{path}: the document has more than 1,000 characters of text, the limit for a document "
                    "(hint: split it into smaller documents, or give only the part you need)")


def test_a_pdfs_text_is_counted_page_by_page_and_refused_as_soon_as_it_is_over(
    small_text_budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pypdf import PageObject

    extracted: list[int] = []
    extract = PageObject.extract_text
    monkeypatch.setattr(PageObject, "extract_text", lambda page, *a, **k: extracted.append(1) or extract(page, *a, **k))
    refused(_text_pages(tmp_path / "long.pdf", 10))  # ~300 characters a page
    assert len(extracted) == 4  # not the 10 pages


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: _text_pages(p / "pages.pdf", 4), "the PDF has 4 pages, over the limit of 3 pages"),
        (lambda p: make_epub(p / "book.epub", ["<p>Chapter.</p>"] * 4), "the EPUB has 4 chapters, over the limit of 3 chapters"),
    ],
    ids=["pdf", "epub"],
)
def test_pages_over_the_budget_are_refused(make, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_PAGES", 3)
    path = make(tmp_path)
    line, _ = refused(path)
    assert line == f"{path}: {expected} (hint: split it into smaller documents, or give only the part you need)"


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt"
    with path.open("wb") as sparse:  # 65 MiB that take no room on disk
        sparse.truncate(limits.MAX_FILE_BYTES + MIB)
    line, peak = refused(path)
    assert line == (f"{path}: the file is 65 MiB, over the limit of 64 MiB for a document "
                    "(hint: split it into smaller documents, or give only the part you need)")
    assert peak < MIB


def test_the_limits_are_the_servers_upload_limit_and_far_above_real_documents(tmp_path: Path) -> None:
    """The longest CUAD contract (287,268 characters) as a DOCX and as an EPUB, read whole."""
    from kvchat.server.service import ServerLimits

    assert limits.MAX_FILE_BYTES == ServerLimits(model_id="x").max_body_bytes
    paragraphs = [line for line in LONGEST_CUAD.read_text().splitlines() if line.strip()]
    word = docx.Document()
    for paragraph in paragraphs:
        word.add_paragraph(paragraph)
    word.save(tmp_path / "contract.docx")
    book = epub.EpubBook()
    book.set_identifier("cuad")
    book.set_title("Contract")
    book.set_language("en")
    step = len(paragraphs) // 20 + 1
    chapters = [epub.EpubHtml(title=f"Part {n}", file_name=f"part{n}.xhtml", content="".join(
        f"<p>{line.replace('&', '&amp;').replace('<', '&lt;')}</p>" for line in paragraphs[start : start + step]))
        for n, start in enumerate(range(0, len(paragraphs), step))]
    for chapter in chapters:
        book.add_item(chapter)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = chapters
    epub.write_epub(tmp_path / "contract.epub", book)
    for name in ("contract.docx", "contract.epub"):
        assert len(load_document(tmp_path / name).text) > 270_000


# ---- markup: depth and tags ------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "<div>" * depth + "<p>The boat was called Grey Heron.</p>" + "</div>" * depth + "<p>The radio failed.</p>"


@pytest.mark.parametrize("depth", [MAX_MARKUP_DEPTH - 3, 300, 200_000])  # html, body and p nest too
def test_markup_nested_deeper_than_the_limit_is_refused_in_one_line_instead_of_read_as_no_text(depth: int, tmp_path: Path) -> None:
    page = tmp_path / "deep.html"
    page.write_text(f"<html><body>{_nested(depth)}</body></html>")
    if depth < MAX_MARKUP_DEPTH:
        assert load_document(page).text == "The boat was called Grey Heron.\n\nThe radio failed."
        return
    line, peak = refused(page)
    assert line == (f"{page}: elements are nested more than {MAX_MARKUP_DEPTH} deep, the limit (browsers stop there too) "
                    "(hint: is the file what it claims to be? If it is, save it again from its application, or convert it to PDF)")
    assert peak < 64 * 2**20


def test_an_epub_chapter_nested_too_deep_is_named(tmp_path: Path) -> None:
    book = make_epub(tmp_path / "deep.epub", ["<p>Fine.</p>", _nested(1000)])
    line, _ = refused(book)
    assert line.startswith(f"{book}, c1.xhtml: elements are nested more than {MAX_MARKUP_DEPTH} deep")


def test_a_text_node_over_libxml2s_10_mb_is_read_whole(tmp_path: Path) -> None:
    page = tmp_path / "long.html"
    page.write_text("<html><body><p>" + "Heron " * 2_000_000 + "</p><p>The radio failed.</p></body></html>")  # 12 MB
    text = load_document(page).text
    assert len(text) == 6 * 2_000_000 - 1 + len("\n\nThe radio failed.") and text.endswith("The radio failed.")


def test_markup_of_more_tags_than_the_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    page = tmp_path / "tags.html"
    page.write_text("<b>x</b>" * (MAX_MARKUP_TAGS // 2 + 1))
    line, peak = refused(page)
    assert line.startswith(f"{page}: the markup has {MAX_MARKUP_TAGS + 2:,} tags, over the limit of {MAX_MARKUP_TAGS:,}")
    assert peak < 64 * 2**20  # the text and its decoding: no tree was built


# ---- damaged files: lines that speak of the file, not of a library's objects ------------------------

WORD_NAMESPACE = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
OPF_NAMESPACE = "http://www.idpf.org/2007/opf"


def _epub_with(path: Path, opf: bytes, chapters: Sequence[tuple[str, bytes]] = ()) -> Path:
    members = [stored("mimetype", b"application/epub+zip"), deflated("META-INF/container.xml", [(CONTAINER, 1)]),
               deflated("content.opf", [(opf, 1)])]
    return write_zip(path, members + [deflated(href, [(body, 1)]) for href, body in chapters])


@pytest.mark.parametrize(("name", "make", "reason"), [
    ("other.docx", lambda p: make_docx(p, {"word/document.xml": deflated("word/document.xml", [(b"<foo/>", 1)])}),
     "not a readable DOCX (its parts are not laid out as DOCX requires)"),  # was: "'lxml.etree._Element' object has no attribute 'body'"
    ("bodiless.docx", lambda p: make_docx(p, {"word/document.xml": deflated(
        "word/document.xml", [(f'<w:document xmlns:w="{WORD_NAMESPACE}"/>'.encode(), 1)])}),
     "not a readable DOCX (its parts are not laid out as DOCX requires)"),  # was: "'NoneType' object has no attribute …"
    ("empty.epub", lambda p: _epub_with(p, f'<package xmlns="{OPF_NAMESPACE}" version="3.0"/>'.encode()),
     "not a readable EPUB (its parts are not laid out as EPUB requires)"),  # was: "… no attribute 'nsmap'"
    ("random.epub", lambda p: _epub_with(p, package([("c0", "c0.xhtml", "application/xhtml+xml")], ["c0"]),
                                         [("c0.xhtml", bytes(range(256)) * 8)]),
     "c0.xhtml: looks like a binary file, not text"),  # was: read as 1,049 characters of garbage
])
def test_a_damaged_docx_or_epub_is_named_in_words_about_the_file(name: str, make, reason: str, tmp_path: Path) -> None:
    path = make(tmp_path / name)
    line, _ = refused(path)
    assert line.startswith(f"{path}: {reason} (hint: ") or line.startswith(f"{path}, {reason} (hint: "), line


# ---- a PDF page too large to render ----------------------------------------------------------------


def make_page_pdf(path: Path, width: float, height: float, user_unit: float | None = None) -> Path:
    """One blank page of `width` x `height` points (and a UserUnit), no text layer: OCR'd."""
    writer = PdfWriter()
    page = writer.add_blank_page(width=100, height=100)
    page.mediabox = RectangleObject([0, 0, width, height])
    if user_unit is not None:
        page[NameObject("/UserUnit")] = FloatObject(user_unit)
    writer.write(path)
    return path


@pytest.fixture
def ocr_images(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The size of each image handed to tesseract, which reads "Grey Heron" on each (no tesseract needed)."""
    sizes: list[tuple[int, int]] = []
    monkeypatch.setattr(pdf_module, "tesseract_installed", lambda: True)
    monkeypatch.setattr(ocr_module, "read_image", lambda path, number, image, *a, **k: sizes.append(image.size) or "Grey Heron")
    return sizes


@pytest.mark.parametrize(
    ("width", "height", "user_unit", "expected"),
    [
        (1e6, 1e6, 75000, (6000, 6000)),  # a 343-byte hugebox_userunit.pdf
        (14400, 14400, None, (6000, 6000)),  # the largest page PDF allows: 60,000 x 60,000 pixels at 300 dpi
        (14400, 100, None, (32767, 228)),  # a strip: the side tesseract takes at most
        (612, 792, None, (2550, 3300)),  # US Letter: 300 dpi, as ever
    ],
    ids=["1e6-pt-user-unit", "14400-pt", "strip", "letter"],
)
def test_a_huge_page_is_rendered_for_ocr_within_the_pixel_budget(
    width: float, height: float, user_unit: float | None, expected: tuple[int, int], ocr_images, tmp_path: Path
) -> None:
    document = load_document(make_page_pdf(tmp_path / "huge.pdf", width, height, user_unit))
    assert document.text == "Grey Heron"
    ((image_width, image_height),) = ocr_images
    assert abs(image_width - expected[0]) <= 1 and abs(image_height - expected[1]) <= 1
    assert image_width * image_height <= limits.MAX_OCR_PIXELS + image_width + image_height
    assert max(image_width, image_height) <= limits.MAX_OCR_SIDE


def test_a_page_that_cannot_be_rendered_within_the_budget_is_refused(ocr_images, tmp_path: Path) -> None:
    path = make_page_pdf(tmp_path / "thread.pdf", 1e6, 2)
    line, _ = refused(path)
    assert line.startswith(f"{path}: page 1 of the PDF is 1,000,000 x 2 pt, too large to render for OCR within the "
                           "limits of 36,000,000 pixels and 32,767 pixels a side (hint: ")
    assert ocr_images == []


def test_the_archive_reader_reads_what_it_is_asked_for(tmp_path: Path) -> None:
    path = make_epub(tmp_path / "book.epub", ["<p>The boat was called Grey Heron.</p>"])
    with archive_module.Archive(path, path.read_bytes(), "EPUB") as archive:
        assert archive.read("c0.xhtml") == CHAPTER.format("<p>The boat was called Grey Heron.</p>").encode()
        assert archive.inflated == len(CHAPTER.format("<p>The boat was called Grey Heron.</p>"))
        with pytest.raises(KeyError):
            archive.read("missing.xhtml")
