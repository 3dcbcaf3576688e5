"""Reading a document can be stopped (issue 32, "work that can be stopped"): OCR looks at a cancel
event between pages and while tesseract reads one; SIGTERM or SIGINT stops `kvchat ask` during
OCR within a second or two with "kvchat: stopped"; an upload's OCR stops when its client leaves or
the server shuts down. On every path the temporary files go: each test gives the work a private
temporary folder and asserts it is empty afterwards."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pypdf import PdfWriter

from tests.fake_engine import FakeEngine
from kvchat.documents import load_document
from kvchat.documents import ocr as ocr_module
from kvchat.documents.limits import MAX_FILE_BYTES
from kvchat.errors import CancelledError, DocumentError
from kvchat.server.runner import GRACE_S
from kvchat.server.service import ServerLimits
from tests.server_harness import serving
from tests.system_tools import system_tool

STOP_WITHIN_S = 3.0  # "a second or two", with room for a machine busy with other tests
START_WITHIN_S = 60.0  # Python, pypdf and the first page's render on a busy 2-core machine


def blank_pdf(path: Path, pages: int) -> Path:
    """`pages` blank Letter pages with no text layer: each goes to OCR (and reads as nothing)."""
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=612, height=792)
    writer.write(path)
    return path


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder of everything in this process, empty; tests assert it is empty after."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def fake_tesseract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tesseract that marks it started (the returned file) and then reads for a minute."""
    started = tmp_path / "tesseract-started"
    script = tmp_path / "fake-tesseract"
    script.write_text(f'#!/bin/sh\ntouch "{started}"\nexec sleep 60\n')
    script.chmod(0o755)
    monkeypatch.setattr(ocr_module, "TESSERACT", str(script))
    return started


def wait_for(condition, within_s: float, what: str) -> None:
    """Until `condition()` holds (checked every 20 ms), at most `within_s`."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        time.sleep(0.02)


# ---- in the library: the cancel event --------------------------------------------------------------


class CancelAt(threading.Event):
    """A cancel event that is set as it is looked at the `look`-th time; `looks` counts them."""

    def __init__(self, look: int) -> None:
        super().__init__()
        self.look, self.looks = look, 0

    def is_set(self) -> bool:
        self.looks += 1
        if self.looks == self.look:
            self.set()
        return super().is_set()


def _long_docx(path: Path) -> Path:
    import docx

    word = docx.Document()
    for number in range(300):
        word.add_paragraph(f"Paragraph {number}." if number % 2 else "")  # empty paragraphs are looked at too
    word.save(str(path))
    return path


@pytest.mark.parametrize("kind", ["docx", "epub", "pdf"])
def test_a_cancel_event_stops_the_extraction_of_a_docx_epub_or_text_pdf_between_two_blocks(kind: str, tmp_path: Path) -> None:
    from tests.documents.test_budgets import make_epub
    from tests.documents.test_normalize import make_text_pdf

    path = {"docx": lambda: _long_docx(tmp_path / "long.docx"),
            "epub": lambda: make_epub(tmp_path / "long.epub", [f"<p>Chapter {n}.</p>" for n in range(100)]),
            "pdf": lambda: make_text_pdf(tmp_path / "long.pdf", [[f"Page {n}."] for n in range(40)])}[kind]()
    cancel = CancelAt(look=5)
    with pytest.raises(CancelledError):
        load_document(path, cancel=cancel)
    assert cancel.looks == 5  # it stopped at the look that found the cancel set, not a block later



@pytest.mark.system
def test_a_cancel_event_stops_ocr_between_pages(private_tmp: Path, tmp_path: Path) -> None:
    system_tool("tesseract", "tesseract-ocr")
    cancel = threading.Event()
    reports: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        reports.append((done, total))
        if done == 2:
            cancel.set()

    with pytest.raises(CancelledError):
        load_document(blank_pdf(tmp_path / "blank.pdf", 6), progress, cancel)
    assert reports == [(0, 6), (1, 6), (2, 6)]  # no third page was read
    assert list(private_tmp.iterdir()) == []


@pytest.mark.system
def test_a_cancel_event_stops_tesseract_within_a_page(private_tmp: Path, fake_tesseract: Path, tmp_path: Path) -> None:
    cancel = threading.Event()
    stopped: list[float] = []
    path = blank_pdf(tmp_path / "blank.pdf", 3)
    timer = threading.Thread(target=lambda: (wait_for(fake_tesseract.exists, START_WITHIN_S, "OCR start"),
                                             stopped.append(time.monotonic()), cancel.set()))
    timer.start()
    with pytest.raises(CancelledError):
        load_document(path, cancel=cancel)
    took = time.monotonic() - stopped[0]
    timer.join()
    assert took < STOP_WITHIN_S  # the fake reads for 60 s: it was killed
    assert list(private_tmp.iterdir()) == []


@pytest.mark.system
def test_a_failing_tesseract_is_one_line_naming_the_page(private_tmp: Path, tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "broken-tesseract"
    script.write_text('#!/bin/sh\necho "Error: no language data" >&2\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setattr(ocr_module, "TESSERACT", str(script))
    path = blank_pdf(tmp_path / "blank.pdf", 1)
    with pytest.raises(DocumentError) as raised:
        load_document(path)
    assert raised.value.one_line().startswith(f"{path}: OCR failed on page 1 (Error: no language data) (hint: check the tesseract")
    assert list(private_tmp.iterdir()) == []


# ---- the CLI: SIGTERM and SIGINT during OCR ---------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_ocr_stops_ask_at_once_and_leaves_no_file(signum: signal.Signals, tmp_path: Path) -> None:
    system_tool("tesseract", "tesseract-ocr")
    child_tmp = tmp_path / "tmp"
    child_tmp.mkdir()
    path = blank_pdf(tmp_path / "blank.pdf", 500)  # ~2 minutes of OCR
    env = {**os.environ, "TMPDIR": str(child_tmp), "KVCHAT_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "kvchat.cli", "ask", str(path), "What is on the pages?", "--model", str(tmp_path / "none.gguf")]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # the page being read (kvchat-ocr-*/page.png) shows that OCR runs
        wait_for(lambda: any(child_tmp.glob("kvchat-ocr-*/page.png")) or process.poll() is not None, START_WITHIN_S, "OCR start")
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        signalled = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 130 and lines[-1] == "kvchat: stopped", stderr
    assert "Traceback" not in stderr
    assert took < STOP_WITHIN_S, f"stopped {took:.2f} s after {signum.name}"
    assert list(child_tmp.iterdir()) == []  # no kvchat-ocr-*, no tess_*


# ---- the server: an upload whose client leaves, a server that stops ---------------------------------


def test_the_servers_upload_limit_is_the_document_file_limit() -> None:
    assert ServerLimits(model_id="x").max_body_bytes == MAX_FILE_BYTES


def _upload_request(host: str, port: int, name: str, data: bytes) -> bytes:
    boundary = "kvchat-test-boundary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            f"Content-Type: application/pdf\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /v1/documents HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


class _WatchedAdd:
    """DocumentLibrary.add, noting how it ended (the exception) and when."""

    def __init__(self, add) -> None:
        self.add = add
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.at = 0.0

    def __call__(self, *args, **kwargs):
        try:
            return self.add(*args, **kwargs)
        except BaseException as error:
            self.error = error
            raise
        finally:
            self.at = time.monotonic()
            self.ended.set()


@pytest.fixture
def asgi_errors() -> Iterator[tuple[list[str], logging.Handler]]:
    """What uvicorn logs as errors ("Exception in ASGI application"), once a server started."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Collect(logging.ERROR)
    yield records, handler
    logging.getLogger("uvicorn.error").removeHandler(handler)


def _watched_service() -> tuple[object, _WatchedAdd]:
    service = FakeEngine().service()
    watched = _WatchedAdd(service.documents.add)
    service.documents.add = watched  # type: ignore[method-assign]
    return service, watched


def _start_upload(url: str, handler: logging.Handler, data: bytes, started: Path) -> socket.socket:
    """A client that uploads `data` over a raw socket, returned once its OCR has started."""
    logging.getLogger("uvicorn.error").addHandler(handler)
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.sendall(_upload_request(host, int(port), "scan.pdf", data))
    wait_for(started.exists, START_WITHIN_S, "OCR start")
    return client


@pytest.mark.system
def test_an_upload_whose_client_leaves_stops_its_ocr(private_tmp: Path, fake_tesseract: Path, tmp_path: Path, asgi_errors) -> None:
    records, handler = asgi_errors
    service, watched = _watched_service()
    data = blank_pdf(tmp_path / "blank.pdf", 3).read_bytes()
    with serving(service) as url:
        with _start_upload(url, handler, data, fake_tesseract):
            left = time.monotonic()
        assert watched.ended.wait(STOP_WITHIN_S), "the upload's OCR went on after its client left"
        assert isinstance(watched.error, CancelledError) and watched.at - left < STOP_WITHIN_S
        assert service.documents.all() == []
    assert list(private_tmp.iterdir()) == []  # no kvchat-upload-*, no kvchat-ocr-*
    assert records == []


@pytest.mark.system
def test_a_server_stopping_during_an_upload_stops_its_ocr_without_a_traceback(
    private_tmp: Path, fake_tesseract: Path, tmp_path: Path, asgi_errors
) -> None:
    records, handler = asgi_errors
    service, watched = _watched_service()
    data = blank_pdf(tmp_path / "blank.pdf", 3).read_bytes()
    with serving(service) as url:
        client = _start_upload(url, handler, data, fake_tesseract)
        stopping = time.monotonic()
    # serving() stopped the server: the upload's OCR stopped and its client got 503, before uvicorn's grace (5 s) was over
    stopped_after = time.monotonic() - stopping
    try:
        assert watched.ended.is_set() and isinstance(watched.error, CancelledError)
        client.settimeout(5)
        answer = client.recv(65536).decode("latin-1")
        assert answer.startswith("HTTP/1.1 503"), answer
    finally:
        client.close()
    assert stopped_after < GRACE_S
    assert list(private_tmp.iterdir()) == []
    assert records == []  # neither "Exception in ASGI application" nor "Cancel 1 running task(s)"


@pytest.mark.system
async def test_esc_in_the_chat_app_stops_the_ocr_of_the_document_it_opens(private_tmp: Path, fake_tesseract: Path, tmp_path: Path) -> None:
    from kvchat.tui.app import KvchatApp
    from kvchat.tui.sessions import EngineSessionFactory
    from tests.tui.test_tui import SIZE, wait_for as wait_in_app

    scan = blank_pdf(tmp_path / "scan.pdf", 3)
    app = KvchatApp(EngineSessionFactory("no model is loaded before the documents are"), [scan])
    async with app.run_test(size=SIZE) as pilot:
        await asyncio.to_thread(wait_for, fake_tesseract.exists, START_WITHIN_S, "OCR start")
        pressed = time.monotonic()
        await pilot.press("escape")
        await wait_in_app(pilot, lambda: app.busy is None, STOP_WITHIN_S)
        stopped_after = time.monotonic() - pressed
        assert app.session is None
    assert stopped_after < STOP_WITHIN_S
    assert list(private_tmp.iterdir()) == []
