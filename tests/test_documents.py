"""Reading documents, and refusing the ones that cannot be read, with one clear error each."""

from __future__ import annotations

from pathlib import Path

import pytest
from pypdf import PdfWriter

from kvchat.documents import load_document
from kvchat.errors import DocumentError

SAMPLE_PDF = Path(__file__).parents[1] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


def make_encrypted_pdf(path: Path) -> Path:
    writer = PdfWriter(clone_from=SAMPLE_PDF)
    writer.encrypt(user_password="secret", owner_password="owner")
    writer.write(path)
    return path


def make_scanned_pdf(path: Path) -> Path:
    writer = PdfWriter()
    writer.add_blank_page(width=612, height=792)
    writer.write(path)
    return path


def make_corrupt_pdf(path: Path) -> Path:
    path.write_bytes(SAMPLE_PDF.read_bytes()[:3000])
    return path


BAD_DOCUMENTS = {
    "missing": (lambda p: p / "nope.pdf", "no such file"),
    "directory": (lambda p: p, "directory"),
    "empty": (lambda p: (p / "empty.txt").write_text("   \n") and p / "empty.txt", "empty"),
    "binary": (lambda p: (p / "x.bin").write_bytes(bytes(range(256)) * 40) and p / "x.bin", "binary"),
    "encrypted": (lambda p: make_encrypted_pdf(p / "locked.pdf"), "encrypted"),
    "scanned": (lambda p: make_scanned_pdf(p / "scan.pdf"), "no extractable text"),
    "corrupt": (lambda p: make_corrupt_pdf(p / "broken.pdf"), "pdf"),
}


@pytest.mark.parametrize("kind", sorted(BAD_DOCUMENTS))
def test_bad_documents_raise_document_error(kind: str, tmp_path: Path) -> None:
    make, expected = BAD_DOCUMENTS[kind]
    path = make(tmp_path)
    with pytest.raises(DocumentError) as info:
        load_document(path)
    assert expected in info.value.message.lower()
    assert info.value.hint
    assert "\n" not in info.value.one_line()


def test_pdf_keeps_page_boundaries() -> None:
    document = load_document(SAMPLE_PDF)
    assert document.kind == "pdf" and len(document.pages) > 3
    page = document.page_at(document.text.index("construed in accordance with the laws"))
    assert page is not None and 1 < page <= len(document.pages)
    first = document.pages[0]
    assert document.text[first.start : first.end].strip()


def test_text_encoding_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("Le café coûte 3 € à Genève, déjà payé.\n".encode("cp1252") * 20)
    document = load_document(path)
    assert "café coûte" in document.text and "Genève" in document.text


def test_markdown_and_html(tmp_path: Path) -> None:
    markdown = tmp_path / "notes.md"
    markdown.write_text("# Title\n\nSome *text*.\n")
    assert load_document(markdown).kind == "markdown"
    html = tmp_path / "page.html"
    html.write_text("<html><head><style>p{}</style><script>var x=1;</script></head>"
                    "<body><h1>Report</h1><p>Revenue was <b>42</b> million.</p></body></html>")
    document = load_document(html)
    assert document.kind == "html"
    assert "Revenue was 42 million." in document.text and "var x" not in document.text
