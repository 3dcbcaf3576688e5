"""One text normalization for every format: what it changes, what it keeps, and that page ranges and
the kept view's character ranges point at the normalized text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import ContentStream, DictionaryObject, NameObject

from kvchat.documents import load_document
from kvchat.documents.normalize import normalize_pages
from kvchat.engine.text.document_text import kept_text_spans
from kvchat.engine.prompt import chat_messages, split_rendered

SAMPLE_PDF = Path(__file__).parents[2] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"
HELVETICA = DictionaryObject({
    NameObject("/Type"): NameObject("/Font"),
    NameObject("/Subtype"): NameObject("/Type1"),
    NameObject("/BaseFont"): NameObject("/Helvetica"),
    NameObject("/Encoding"): NameObject("/WinAnsiEncoding"),  # has U+00A0 and U+00AD, as PDFs use them
})
# What PDF extraction hands back: words joined by no-break spaces, soft hyphens inside words and
# at a line end, a hyphenated compound and a hyphenated word broken at line ends; an empty page.
PDF_PAGES = [
    [
        "Clause\u00a01.\u00a0The\u00a0Licensee\u00a0shall\u00a0pay\u00a0an",
        "inter\u00adna\u00adtional\u00a0fee\u00a0for\u00a0a\u00a0non-",
        "exclusive\u00a0licence\u00a0within\u00a0thirty\u00a0days.\u00a0Its\u00a0con\u00ad",
        "sideration\u00a0is\u00a0inter-",
        "national.",
    ],
    [],
    ["   Clause\u00a02.\u00a0\u00a0Notices   ", "Sent\u00a0by\u00a0post   to  the\u00a0Licensee."],
]
PDF_TEXTS = [
    "Clause 1. The Licensee shall pay an\n"
    "international fee for a non-exclusive licence within thirty days. Its consideration is international.",
    "",
    "Clause 2. Notices\nSent by post to the Licensee.",
]


def _line(text: str) -> bytes:
    data = text.encode("cp1252").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
    return b"(" + data + b") Tj T* "


def make_text_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF whose pages show `pages`' lines in Helvetica, one text line each."""
    writer = PdfWriter()
    for lines in pages:
        page = writer.add_blank_page(width=612, height=792)
        fonts = DictionaryObject({NameObject("/F1"): HELVETICA})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
        content = ContentStream(None, None)
        content.set_data(b"BT /F1 12 Tf 14 TL 72 720 Td " + b"".join(map(_line, lines)) + b"ET")
        page.replace_contents(content)
    writer.write(path)
    return path


def normalize(text: str, keep_indentation: bool = True) -> str:
    (normalized,) = normalize_pages([text], keep_indentation)
    return normalized


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # every space-like character: a plain space
        ("a\u00a0b\u2002c\u2009d\u202fe\u3000f\u205fg\u1680h", "a b c d e f g h"),
        ("one  \u00a0 two\t\tthree   ", "one two\t\tthree"),  # runs as one; tabs lay out columns; no trailing
        ("line one\r\nline two\rline three\u2028four\x0cfive", "line one\nline two\nline three\nfour\nfive"),
        ("clause 1\n\n\n \n\nclause 2\nclause 3", "clause 1\n\nclause 2\nclause 3"),  # one blank line; single newlines stay
        # NFKC: a ligature, fullwidth letters and digits, the Greek question mark, a circled digit
        ("\ufb01nal \uff21\uff22\uff23\uff11 x\u037e \u2460 \u2163", "final ABC1 x; 1 IV"),
        # kept, NFKC would change the meaning: superscript, subscript, fraction, ordinal, ™; a spacing accent
        ("x\u00b2 H\u2082O 1\u00bd 1\u00ba Acme\u2122 caf\u00b4e", "x\u00b2 H\u2082O 1\u00bd 1\u00ba Acme\u2122 caf\u00b4e"),
        ("cafe\u0301 non\u2011breaching pre\u2010paid", "caf\u00e9 non-breaching pre-paid"),  # composed; hyphens as "-"
        ("ex\u00adample zero\u200bwidth\u2060joined \ufeffbom", "example zerowidthjoined bom"),  # invisible marks go
        ("\U0001f469\u200d\U0001f4bb \u0646\u0645\u200c\u0645", "\U0001f469\u200d\U0001f4bb \u0646\u0645\u200c\u0645"),  # joiners stay
        ("hyphen\u00ad\n  ation", "hyphenation"),  # a soft hyphen at a line end joins the lines
        ("a non-\nexclusive, royalty-\n  free licence", "a non-exclusive, royalty-free licence"),
        ("inter-\nnational and international", "international and international"),  # the closed word occurs
        ("co-\noperation, co-operation, cooperation", "co-operation, co-operation, cooperation"),  # both occur: kept
        ("product-by-\nproduct, a byproduct", "product-by-product, a byproduct"),  # in a compound: kept
        ("Schedule-\nA and 1995-\n2000 and end -\nnext", "Schedule-\nA and 1995-\n2000 and end -\nnext"),
        ("  \u00a0 Title\n    code()\n      indented", "Title\n    code()\n      indented"),  # indentation kept
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_a_pdfs_indentation_goes() -> None:
    assert normalize("  Title\n    body text\n\tcell", keep_indentation=False) == "Title\nbody text\n\tcell"


def test_words_hyphenated_on_another_page_decide() -> None:
    """The vocabulary is the whole document's, but no word is joined across a page boundary."""
    assert normalize_pages(["an inter-\nnational fee", "international", "inter-"]) == [
        "an international fee", "international", "inter-",
    ]


def test_pdf_text_and_page_ranges_are_exact(tmp_path: Path) -> None:
    path = make_text_pdf(tmp_path / "contract.pdf", PDF_PAGES)
    document = load_document(path)
    assert document.text == "\n\n".join(text for text in PDF_TEXTS if text)
    assert [(page.number, page.start, page.end) for page in document.pages] == [
        (1, 0, len(PDF_TEXTS[0])),
        (2, len(PDF_TEXTS[0]), len(PDF_TEXTS[0])),  # the empty page: an empty range, no separator of its own
        (3, len(PDF_TEXTS[0]) + 2, len(PDF_TEXTS[0]) + 2 + len(PDF_TEXTS[2])),
    ]
    assert [document.text[page.start : page.end] for page in document.pages] == PDF_TEXTS
    assert document.page_at(document.text.index("Notices")) == 3
    assert document.page_at(document.text.index("consideration")) == 1


def test_sample_pdf_pages_are_their_normalized_text() -> None:
    """Every page range of a real contract holds exactly that page's normalized pypdf text."""
    document = load_document(SAMPLE_PDF)
    raw = [page.extract_text() for page in PdfReader(SAMPLE_PDF).pages]
    expected = normalize_pages(raw, keep_indentation=False)
    assert [document.text[page.start : page.end] for page in document.pages] == expected
    assert document.text == document.text.strip() and "\u00a0" not in document.text and "  " not in document.text


@pytest.mark.parametrize("suffix", [".txt", ".md", ".html"])
def test_every_format_is_normalized(suffix: str, tmp_path: Path) -> None:
    raw = "Fee\u00a0of\u00a0\u00a0ten\u00a0dollars, non-\nrefundable.\n\n\n\nSigned."
    path = tmp_path / f"notes{suffix}"
    path.write_text(f"<html><body><pre>{raw}</pre></body></html>" if suffix == ".html" else raw, encoding="utf-8")
    document = load_document(path)
    assert document.text == "Fee of ten dollars, non-refundable.\n\nSigned."
    assert [(page.start, page.end) for page in document.pages] == [(0, len(document.text))]


def test_kept_view_points_at_the_normalized_text(tiny_model, tmp_path: Path) -> None:
    """kept_text_spans over the prompt the conversation renders: each kept token maps back to the
    very characters of Document.text it spells, and page 3's tokens to page 3's range."""
    document = load_document(make_text_pdf(tmp_path / "contract.pdf", PDF_PAGES))
    assert document.text.strip() == document.text
    part, _, _ = split_rendered(tiny_model.apply_chat_template(chat_messages(document.text, [], "Who pays?")))
    tokens = part.tokens(tiny_model)

    def spans(positions: list[int]) -> list[tuple[int, int]]:
        return kept_text_spans(tiny_model, part.text, document.text.strip(), tokens, positions)

    inside = []
    for position, token in enumerate(tokens):
        found = spans([position])
        piece = tiny_model.piece(token).decode("utf-8")
        if found and len(piece) == found[0][1] - found[0][0]:
            ((start, end),) = found
            assert document.text[start:end] == piece
            inside.append((position, start))
    assert "".join(tiny_model.piece(tokens[p]).decode("utf-8") for p, _ in inside) == document.text
    third = document.pages[2]
    assert spans([p for p, start in inside if start >= third.start]) == [(third.start, third.end)]


@pytest.mark.parametrize("text", ["a-" * 50_000, " " * 200_000 + "x", "\n " * 100_000 + "x"], ids=["compound", "spaces", "lines"])
def test_long_runs_take_linear_time(text: str) -> None:
    """Every pattern starts only where a run starts: a backtracking one took minutes on these."""
    started = time.perf_counter()
    normalize_pages([text], keep_indentation=False)
    assert time.perf_counter() - started < 10
