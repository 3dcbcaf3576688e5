"""Reading documents, and refusing the ones that cannot be read, with one clear error each."""

from __future__ import annotations

import codecs
import io
import os
import random
import struct
import subprocess
import sys
import tomllib
import zipfile
import zlib
from pathlib import Path

import pytest
from pypdf import PdfWriter

from kvchat.documents import load_document
from kvchat.errors import DocumentError

SAMPLE_PDF = Path(__file__).parents[2] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


def make_encrypted_pdf(path: Path, user_password: str = "secret", algorithm: str = "RC4-128") -> Path:
    """The sample, encrypted; with user password "" it opens without one (owner-restricted)."""
    writer = PdfWriter(clone_from=SAMPLE_PDF)
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm=algorithm)
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
    "password-protected": (lambda p: make_encrypted_pdf(p / "locked.pdf"), "password-protected"),
    "password-protected-aes": (lambda p: make_encrypted_pdf(p / "locked.pdf", algorithm="AES-256"), "password-protected"),
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


@pytest.mark.parametrize("algorithm", ["RC4-128", "AES-128", "AES-256"])
def test_pdf_that_opens_without_a_password_is_read(algorithm: str, tmp_path: Path) -> None:
    path = make_encrypted_pdf(tmp_path / "restricted.pdf", user_password="", algorithm=algorithm)
    assert load_document(path).text == load_document(SAMPLE_PDF).text


def test_aes_support_is_a_dependency() -> None:
    """pypdf reads AES-encrypted PDFs only with its crypto extra (the cryptography package)."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert any(spec.replace(" ", "").startswith("pypdf[crypto]") for spec in project["dependencies"])


@pytest.mark.system
@pytest.mark.parametrize("user_password", ["", "secret"])
def test_pdf_without_aes_support_is_one_document_error(user_password: str, tmp_path: Path) -> None:
    """Defence in depth: with no AES provider pypdf raises DependencyError, which must not escape."""
    path = make_encrypted_pdf(tmp_path / "aes.pdf", user_password=user_password, algorithm="AES-256")
    script = (
        "import sys\n"
        "sys.modules['cryptography'] = sys.modules['Crypto'] = None  # no AES provider for pypdf\n"
        "from kvchat.documents import load_document\n"
        "from kvchat.errors import DocumentError\n"
        "try:\n"
        "    load_document(sys.argv[1])\n"
        "except DocumentError as error:\n"
        "    print(error.one_line())\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    (line,) = result.stdout.splitlines()
    assert "needs a package that is missing" in line and "pypdf[crypto]" in line


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


WIDE_TEXT = "Chapter 1\nThe quick brown fox jumps over the lazy dog: 3 € a café, naïve.\n" * 40 + "The end."


@pytest.mark.parametrize(
    "encoded",
    [
        codecs.BOM_UTF16_LE + WIDE_TEXT.encode("utf-16-le"),
        codecs.BOM_UTF16_BE + WIDE_TEXT.encode("utf-16-be"),
        WIDE_TEXT.encode("utf-16-le"),  # no BOM: told by the zero high byte of each Latin character
        WIDE_TEXT.encode("utf-16-be"),
        WIDE_TEXT.encode("utf-32"),  # with its BOM
    ],
    ids=["utf-16-le-bom", "utf-16-be-bom", "utf-16-le", "utf-16-be", "utf-32-bom"],
)
def test_utf16_and_utf32_text_is_read_exactly(encoded: bytes, tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(encoded)
    assert load_document(path).text == WIDE_TEXT


def _png() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + bytes((x * y) % 256 for x in range(64)) for y in range(64))
    header = struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("notes.txt", WIDE_TEXT.encode("utf-16-le"))  # stored: wide text inside
    return out.getvalue()


@pytest.mark.parametrize(
    "make",
    [
        _png,
        _zip,
        lambda: Path(os.path.realpath(sys.executable)).read_bytes()[:65536],  # an ELF (or Mach-O, PE)
        lambda: random.Random(7).randbytes(20000),
        lambda: codecs.BOM_UTF16_LE + random.Random(7).randbytes(20000),
        lambda: codecs.BOM_UTF32_LE + random.Random(7).randbytes(20000),
    ],
    ids=["png", "zip", "executable", "random", "random-after-utf16-bom", "random-after-utf32-bom"],
)
def test_binary_files_stay_refused(make, tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(make())
    with pytest.raises(DocumentError, match="binary"):
        load_document(path)


# ---- what is not a regular file --------------------------------------------------------------------


def make_fifo(folder: Path) -> Path:
    os.mkfifo(folder / "notes.txt")  # no writer: opening it to read would block
    return folder / "notes.txt"


def make_socket(folder: Path) -> Path:
    import socket

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "notes.txt"))  # the socket file stays after the socket closes
    listener.close()
    return folder / "notes.txt"


def make_symlink(folder: Path, *links: tuple[str, str]) -> Path:
    for name, target in links:
        (folder / name).symlink_to(folder / target)
    return folder / links[0][0]


LOOP = "symlink loop (symbolic links that lead back to themselves, never to a file)"  # not "no such file"
SPECIAL_FILES = {
    "dev-zero": (lambda p: Path("/dev/zero"), "is a character device, not a regular file"),
    "dev-urandom": (lambda p: Path("/dev/urandom"), "is a character device, not a regular file"),
    "fifo": (make_fifo, "is a FIFO (named pipe), not a regular file"),
    "socket": (make_socket, "is a socket, not a regular file"),
    "symlink-to-itself": (lambda p: make_symlink(p, ("a.txt", "a.txt")), LOOP),
    "symlink-cycle": (lambda p: make_symlink(p, ("a.txt", "b.txt"), ("b.txt", "a.txt")), LOOP),
    "dangling-symlink": (lambda p: make_symlink(p, ("a.txt", "gone.txt")), "no such file (a symlink to a file that does not exist)"),
}


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="POSIX special files")
@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
def test_only_regular_files_are_read(kind: str, tmp_path: Path) -> None:
    """Refused from stat() in one line, nothing read: /dev/zero would never end, a FIFO with no
    writer would block the open. In a thread, so that a regression fails instead of hanging."""
    import threading
    import tracemalloc

    make, expected = SPECIAL_FILES[kind]
    path = make(tmp_path)
    outcome: list[BaseException | object] = []

    def load() -> None:
        try:
            outcome.append(load_document(path))
        except BaseException as error:  # noqa: BLE001 - the test asserts what it was
            outcome.append(error)

    tracemalloc.start()
    try:
        reader = threading.Thread(target=load, daemon=True)
        reader.start()
        reader.join(timeout=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not reader.is_alive(), f"reading {path} blocked"
    (error,) = outcome
    assert isinstance(error, DocumentError)
    assert error.one_line().startswith(f"{path}: {expected} (hint: ")
    assert peak < 2**20


# ---- standard input ----------------------------------------------------------------------------------


class _Stdin:
    """sys.stdin with `data` piped in (or a terminal)."""

    def __init__(self, data: bytes = b"", terminal: bool = False) -> None:
        self.buffer = io.BytesIO(data)
        self.buffer.isatty = lambda: terminal  # type: ignore[method-assign]


def _docx_bytes() -> bytes:
    import docx

    word, out = docx.Document(), io.BytesIO()
    word.add_paragraph("The boat was named the Grey Heron.")
    word.save(out)
    return out.getvalue()


SAMPLE_PDF = Path(__file__).parents[2] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


@pytest.mark.parametrize(("data", "kind"), [
    (b"The boat was named the Grey Heron.\n", "text"),
    (b"<!DOCTYPE html><html><body><p>The boat was named the Grey Heron.</p></body></html>", "html"),
    (_docx_bytes(), "docx"),
    (SAMPLE_PDF.read_bytes(), "pdf"),
], ids=["text", "html", "docx", "pdf"])
def test_dash_reads_the_document_from_standard_input_by_its_content(data: bytes, kind: str, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin(data))
    document = load_document("-")
    assert (document.path, document.kind) == (Path("<stdin>"), kind)
    if kind == "pdf":
        assert document.text == load_document(SAMPLE_PDF).text
    else:
        assert document.text == "The boat was named the Grey Heron."


def test_standard_input_is_refused_from_a_terminal_and_over_the_file_limit(monkeypatch) -> None:
    from kvchat.documents import loader

    monkeypatch.setattr(sys, "stdin", _Stdin(terminal=True))
    with pytest.raises(DocumentError) as terminal:
        load_document("-")
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(sys, "stdin", _Stdin(b"x" * 1001))
    with pytest.raises(DocumentError) as too_much:
        load_document("-")
    assert terminal.value.one_line() == (
        '<stdin>: standard input is a terminal, not a document (hint: pipe one in, e.g. cat notes.txt | kvchat ask - "…", '
        "or give the PDF, DOCX, EPUB, TXT, Markdown or HTML file itself)")
    assert too_much.value.message == "<stdin>: more than 1,000 bytes on standard input, the limit for a document"


@pytest.mark.system
def test_kvchat_inspect_reads_a_piped_document(tiny_model_path: Path, isolated_home: Path) -> None:
    import json

    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run([sys.executable, "-m", "kvchat.cli", "inspect", "--json", "--model", str(tiny_model_path), "-"],
                            input=b"The boat was named the Grey Heron.", capture_output=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    (described,) = json.loads(result.stdout)
    assert (described["path"], described["format"], described["chars"]) == ("<stdin>", "text", 34)
