"""The model kept loaded between `kvchat ask`s, as Ollama keeps one (its keep_alive).

An ask that finds no kept model answers in its own process, then leaves a detached `kvchat
resident` that holds the same model loaded for `--keep-alive` seconds (KVCHAT_KEEP_ALIVE; 5
minutes by default). An ask after it, made with the same model, GPU layers, draft and choice of
saved readings, sends it the document as loaded, the question and the settings, and prints the
events it sends back as it would print its own: it loads no model, and its first token comes a
model's load sooner. Each answer renews the keep-alive with its ask's; an ask's 0 lets the model
go once it answered.

One resident per model and kvchat home, listening on a Unix socket in a folder only its user may
enter (XDG_RUNTIME_DIR, or kvchat-UID in the temporary folder): whoever connects is that user, as
with ssh-agent's socket, so requests and events go as multiprocessing.connection pickles them. A
lock held for its life keeps it the only one; a socket that no process answers is replaced.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

import kvchat
import typer

from kvchat.cli.options import MODEL
from kvchat.documents import Document
from kvchat.engine import NO_DRAFT, AskSettings, Engine
from kvchat.errors import KvchatError, printable
from kvchat.events import Event
from kvchat.llama import WEIGHTS_ENV
from kvchat.paths import cache_dir

KEEP_ALIVE_ENV = "KVCHAT_KEEP_ALIVE"
DEFAULT_KEEP_ALIVE_S = 300


@dataclass(frozen=True)
class Kept:
    """What a kept model's engine is made with: an ask uses one made as its own engine would be."""

    model: str
    gpu_layers: int
    use_cache: bool
    draft: str | None
    draft_at_start: bool

    def socket_path(self) -> Path | None:
        """Where its resident listens; None where no folder of this user's alone can hold it."""
        folder = _private_folder()
        return None if folder is None else folder / f"{self._name()}.sock"

    def _name(self) -> str:
        """The same for the same engine, code and kvchat home; another name for any other."""
        identity = [_file_or_name(self.model), self.gpu_layers, self.use_cache, _file_or_name(self.draft),
                    self.draft_at_start, str(cache_dir().absolute()), os.environ.get(WEIGHTS_ENV), sys.executable,
                    Path(kvchat.__file__).stat().st_mtime_ns, Path(__file__).stat().st_mtime_ns]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:24]


def _file_or_name(model: str | None) -> str | None:
    """A model named by its file is the same model from any folder it is named in."""
    return str(Path(model).resolve()) if model is not None and Path(model).is_file() else model


def _private_folder() -> Path | None:
    """This user's folder for kvchat's sockets, made 0700; None where it exists and is not
    theirs alone (a link, another owner, open to others), or cannot be made."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"kvchat-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        held = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid() or held.st_mode & 0o077:
        return None
    return folder


def keep_alive_s(seconds: int | None) -> int:
    """`--keep-alive`, else KVCHAT_KEEP_ALIVE, else 5 minutes."""
    if seconds is not None:
        return seconds
    value = os.environ.get(KEEP_ALIVE_ENV, "").strip()
    if not value:
        return DEFAULT_KEEP_ALIVE_S
    if not value.isdigit():
        raise KvchatError(f"{KEEP_ALIVE_ENV} is {value!r}, not a number of seconds", f"set {KEEP_ALIVE_ENV} to 300, or 0")
    return int(value)


# ---- the asking side -------------------------------------------------------------------------------


def asked_of_kept(
    kept: Kept, document: Document, question: str, settings: AskSettings, keep_alive: int, cancel: threading.Event,
) -> Iterator[Event] | None:
    """The events of the question's answer from the kept model, as Engine.ask yields them (an
    error it raised is raised here); None where no model is kept so."""
    path = kept.socket_path()
    if path is None:
        return None
    try:
        connection = Client(str(path), family="AF_UNIX")
    except OSError:  # none listens there: none, or one that ended without removing its socket
        return None
    try:
        connection.send(("ask", document, question, settings, keep_alive))
        first = connection.recv()
    except (EOFError, OSError):  # it was letting go as this ask came: this process answers
        connection.close()
        return None
    return _relayed(connection, first, cancel)


def _relayed(connection: Connection, message: tuple, cancel: threading.Event) -> Iterator[Event]:
    """The events the kept model sends, its first `message` received; Ctrl-C (`cancel`) is passed
    on, and it stops its answer as this process's engine would."""
    with closing(connection):
        threading.Thread(target=_pass_on_cancel, args=(connection, cancel), daemon=True).start()
        while True:
            kind, value = message
            if kind == "error":
                raise value
            if kind != "event":
                return
            yield value
            try:
                message = connection.recv()
            except (EOFError, OSError):
                raise KvchatError("the kept model ended while it answered", "ask again") from None


def _pass_on_cancel(connection: Connection, cancel: threading.Event) -> None:
    cancel.wait()
    try:
        connection.send(("cancel",))
    except OSError:  # the answer had ended
        pass


def start_kept(kept: Kept, keep_alive: int, log: Path) -> None:
    """Leave a detached `kvchat resident` keeping the model loaded for the next asks; none where no
    folder of this user's alone can hold its socket (it would only say so and end)."""
    if kept.socket_path() is None:
        return
    command = [sys.executable, "-m", "kvchat.cli", "resident", "--model", _file_or_name(kept.model),
               "--gpu-layers", str(kept.gpu_layers), "--keep-alive", str(keep_alive), "--cache" if kept.use_cache else "--no-cache",
               "--draft", _file_or_name(kept.draft) or NO_DRAFT, "--draft-at-start" if kept.draft_at_start else "--draft-when-needed"]
    with open(log, "ab") as stderr:  # in / : it holds no folder of the user's open (a model named by its file is named whole)
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, cwd="/",
                         start_new_session=True, close_fds=True)


# ---- the kept side ---------------------------------------------------------------------------------


def keep_loaded(kept: Kept, keep_alive: int, told: Callable[[str], None]) -> None:
    """Hold the model loaded and answer asks until `keep_alive` seconds pass without one (each
    answer sets it anew); return at once where another process keeps it. `told`: a line for the log."""
    path = kept.socket_path()
    if path is None:
        told("no folder of this user's alone for its socket: not kept")
        return
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another keeps it
        path.unlink(missing_ok=True)  # a socket left by one that ended: no process holds its lock
        with Engine(kept.model, gpu_layers=kept.gpu_layers, use_cache=kept.use_cache, draft=kept.draft,
                    draft_at_start=kept.draft_at_start) as engine, Listener(str(path), family="AF_UNIX") as listener:
            told(f"kept {kept.model} loaded for {keep_alive} s")
            _serve(engine, listener, path, keep_alive, told)
        path.unlink(missing_ok=True)


def _serve(engine: Engine, listener: Listener, path: Path, keep_alive: int, told: Callable[[str], None]) -> None:
    idle = _IdleStop(path)
    idle.renew(keep_alive)
    while True:
        with listener.accept() as connection:
            idle.cancel()
            try:
                request = connection.recv()
            except Exception as error:  # an asker gone at once, or one of another kvchat version (what it pickled)
                told(f"could not read a request: {error!r}")
                request = None
            if request == ("stop",):
                told("let go after its keep-alive")
                return
            if not (isinstance(request, tuple) and len(request) == 5 and request[0] == "ask"):
                if request is not None:
                    told("left a request it does not know unanswered")
                idle.renew(keep_alive)
                continue
            _, document, question, settings, keep_alive = request
            _answer(engine, connection, document, question, settings)
            told(f"answered a question about {document.path}")
        if keep_alive <= 0:
            told("let go, as its last ask said")
            return
        idle.renew(keep_alive)


class _IdleStop:
    """Asks the resident to stop once `seconds` pass without an ask: a timer that connects and says so."""

    def __init__(self, path: Path) -> None:
        self._path, self._timer = path, None

    def renew(self, seconds: int) -> None:
        self.cancel()
        self._timer = threading.Timer(seconds, self._stop)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _stop(self) -> None:
        try:
            with closing(Client(str(self._path), family="AF_UNIX")) as connection:
                connection.send(("stop",))
        except OSError:  # it stopped meanwhile
            pass


def _answer(engine: Engine, connection: Connection, document: Document, question: str, settings: AskSettings) -> None:
    """Engine.ask's events sent as they come, then its end or its error; the asker's Ctrl-C
    (or its leaving) stops the answer as the engine stops one."""
    cancel = threading.Event()
    watcher = threading.Thread(target=_await_cancel, args=(connection, cancel), daemon=True)
    watcher.start()
    try:
        with closing(engine.ask(document, question, settings, cancel=cancel)) as events:
            for event in events:
                connection.send(("event", event))
        connection.send(("end", None))
    except KvchatError as error:
        _send_quietly(connection, ("error", error))
    except OSError:  # the asker left
        cancel.set()
    finally:  # wake the watcher's recv (closing the connection would not) before the connection goes
        with socket.fromfd(connection.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as same_socket:
            try:
                same_socket.shutdown(socket.SHUT_RDWR)
            except OSError:  # the asker's end is gone already
                pass
        watcher.join()


def _await_cancel(connection: Connection, cancel: threading.Event) -> None:
    try:
        connection.recv()
    except (EOFError, OSError):
        pass
    cancel.set()  # the asker's Ctrl-C, or the asker gone: either ends the answer (or nothing, once it ended)


def _send_quietly(connection: Connection, message: tuple) -> None:
    try:
        connection.send(message)
    except OSError:
        pass


def resident_command(
    model: str = MODEL,
    gpu_layers: int = typer.Option(0, "--gpu-layers"),
    keep_alive: int = typer.Option(DEFAULT_KEEP_ALIVE_S, "--keep-alive", min=0),
    cache: bool = typer.Option(True, "--cache/--no-cache"),
    draft: str = typer.Option(NO_DRAFT, "--draft"),
    draft_at_start: bool = typer.Option(False, "--draft-at-start/--draft-when-needed"),
) -> None:
    """Keep a model loaded for the next `kvchat ask`s (an ask starts it; its log is the background log)."""

    def told(line: str) -> None:
        typer.echo(f"{time.strftime('%F %T')} pid {os.getpid()}: {printable(line)}", err=True)

    keep_loaded(Kept(model, gpu_layers, cache, None if draft == NO_DRAFT else draft, draft_at_start), keep_alive, told)
