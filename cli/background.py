"""A fast first answer's document read in the background as its follow-ups need it (its passages,
or whole: LaterReading), so that the next `kvchat ask` about it loads what it chooses of that
reading (about a second) instead of reading again.

`kvchat ask` hands the document (its text, as loaded: a PDF's OCR is not redone) to a detached
`kvchat read --job FILE` process at low priority, which outlives the ask. The reading's lock
(engine/kvcache/in_progress.py) lets one process read a document: two asks about one new
document start two, and the second finds the first reading it and waits. `kvchat cache list`
shows them, `kvchat cache stop` stops them, and KVCHAT_BACKGROUND_READING=off turns them off.
"""

from __future__ import annotations

import errno
import json
import os
import re
import reprlib
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from kvchat.atomic import atomic_file
from kvchat.documents import Document, Page
from kvchat.engine import AskSettings, KvLayout, readings_in_progress
from kvchat.errors import SettingsError
from kvchat.events import LaterReading

BACKGROUND_ENV = "KVCHAT_BACKGROUND_READING"
NICENESS = 19  # the background reading gives way to anything the user runs meanwhile
SESSION_GROUP = Path("/proc/self/autogroup")  # Linux's scheduling group of this process's session
_GROUP_RETRIES, _GROUP_RETRY_S = 10, 0.1  # unprivileged, Linux renices one group per 0.1 s, system-wide
_ON, _OFF = ("on", "1", "yes", "true"), ("off", "0", "no", "false")
JOB_NAME = re.compile(r"[0-9a-f]{32}\.json")  # write_job's: a uuid4's hex digits


def background_reading_on() -> bool:
    """Whether `kvchat ask` finishes a fast first reading in the background (KVCHAT_BACKGROUND_READING)."""
    value = os.environ.get(BACKGROUND_ENV, "on").strip().lower()
    if value in _ON or not value:
        return True
    if value in _OFF:
        return False
    raise SettingsError(f"unknown {BACKGROUND_ENV} {value!r}", f"set {BACKGROUND_ENV} to on or off")


def lower_priority() -> str | None:
    """Lower this process to niceness 19 and, where it leads a session of its own (a detached
    reader does), that session's scheduling group too; what could not be lowered, or None.

    Linux (autogroup, on by default on most desktops) shares the CPU equally between sessions
    first and by niceness only within one: a niced reader in a session of its own would take as
    much CPU as the user's terminal. Renicing the group makes it give way; a process that shares
    its caller's session leaves that session's group alone."""
    os.nice(NICENESS)
    if os.getsid(0) != os.getpid() or not SESSION_GROUP.exists():
        return None
    for attempt in range(_GROUP_RETRIES):
        if attempt:
            time.sleep(_GROUP_RETRY_S)  # the kernel's rate limit: nothing to await
        try:
            SESSION_GROUP.write_text(str(NICENESS))
            return None
        except OSError as error:
            if error.errno != errno.EAGAIN:
                return f"its session's scheduling group keeps its priority ({error.strerror})"
    return "its session's scheduling group keeps its priority (the kernel was busy renicing others)"


def jobs_folder() -> Path:
    return readings_in_progress().root / "jobs"


def log_path() -> Path:
    """Where background readings write what went wrong (`kvchat cache list` names it)."""
    return readings_in_progress().root / "background.log"


def start_background_reading(document: Document, model: str, settings: AskSettings, gpu_layers: int, later: LaterReading) -> None:
    """Start a detached `kvchat read --job` process that reads `document` as `later` says (its
    passages, or whole: Engine.read_later) and saves that."""
    job = write_job(document, model, settings, gpu_layers, later)
    with open(log_path(), "ab") as log:
        subprocess.Popen(
            job_command(job),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, close_fds=True,
        )


def job_command(job: Path) -> list[str]:
    """The command that does the reading of a job file: this interpreter's `kvchat read --job`."""
    return [sys.executable, "-m", "kvchat.cli", "read", "--job", str(job)]


def write_job(document: Document, model: str, settings: AskSettings, gpu_layers: int, later: LaterReading) -> Path:
    """A job file for `kvchat read --job`: the document as loaded, and how to read it."""
    job = {
        "document": {"path": str(document.path), "kind": document.kind, "text": document.text,
                     "pages": [asdict(page) for page in document.pages]},
        "model": model, "gpu_layers": gpu_layers, "threads": settings.threads, "layout": asdict(settings.layout),
        "system": settings.system,  # part of the document's prompt: the reading saved must be the one asked about
        "later": later.value,
    }
    path = jobs_folder() / f"{uuid.uuid4().hex}.json"
    with atomic_file(path, "w") as out:
        json.dump(job, out)
    return path


def take_job(path: Path) -> tuple[Document, str, int, AskSettings, LaterReading]:
    """The document, model, GPU layers, settings and what to read (Engine.read_later) of a job file, which is deleted once read.
    `kvchat read --job` takes any path: only a plain file in kvchat's jobs folder, named and shaped
    as write_job writes one, is taken; anything else is refused (SettingsError) and left as it is."""
    own = _own_job(path)
    text = _job_text(own)
    try:
        taken = _job_of(json.loads(text))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError; nested too deep
        raise _not_a_job(path, str(error)) from None
    except SettingsError as error:  # a layout or settings of no reading
        raise _not_a_job(path, error.message) from None
    own.unlink(missing_ok=True)
    return taken


def _own_job(path: Path) -> Path:
    """`path` as a job of kvchat's jobs folder (its own name there, never a link followed out of it)."""
    folder = jobs_folder().resolve()
    if path.absolute().parent.resolve() != folder or not JOB_NAME.fullmatch(path.name):
        raise _not_a_job(path, "not in kvchat's jobs folder")
    return folder / path.name


def _job_text(path: Path) -> str:
    """The text of job file `path`: a plain file, never opened through a link (nor a pipe waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise _not_a_job(path, "a symbolic link" if error.errno == errno.ELOOP else error.strerror or str(error)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_job(path, "not a plain file")
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read().decode("utf-8")
        except UnicodeDecodeError as error:
            raise _not_a_job(path, str(error)) from None


# What write_job writes: each object's fields and their types (a job of another shape is not taken).
JOB_FIELDS = {"document": dict, "model": str, "gpu_layers": int, "threads": (int, type(None)), "layout": dict,
              "system": (str, type(None)), "later": str}
DOCUMENT_FIELDS = {"path": str, "kind": str, "text": str, "pages": list}
PAGE_FIELDS = {"number": int, "start": int, "end": int, "source": str, "kind": str}
LAYOUT_FIELDS = {"flash_attn": bool, "type_k": str, "type_v": str}


def _job_of(job: object) -> tuple[Document, str, int, AskSettings, LaterReading]:
    """What job `job` (parsed JSON) asks; ValueError (or SettingsError) where it is not what
    write_job writes."""
    job = _shaped(job, JOB_FIELDS, "the job")
    found = _shaped(job["document"], DOCUMENT_FIELDS, "its document")
    pages = [Page(**_shaped(page, PAGE_FIELDS, "a page")) for page in found["pages"]]
    document = Document(Path(found["path"]), found["kind"], found["text"], pages)
    layout = KvLayout(**_shaped(job["layout"], LAYOUT_FIELDS, "its layout"))
    settings = AskSettings(threads=job["threads"], layout=layout, read="full", system=job["system"])
    return document, job["model"], job["gpu_layers"], settings, LaterReading(job["later"])


def _shaped(value: object, fields: dict[str, type | tuple[type, ...]], what: str) -> dict:
    """`value` where it is an object of exactly `fields`, each of its type; else ValueError."""
    if not isinstance(value, dict) or set(value) != set(fields):
        raise ValueError(f"{what} is not what kvchat writes")
    for name, kind in fields.items():
        field = value[name]
        if not isinstance(field, kind) or (isinstance(field, bool) and kind is not bool):
            raise ValueError(f"{what}'s {name} is {reprlib.repr(field)}")
    return value


def _not_a_job(path: Path, reason: str) -> SettingsError:
    return SettingsError(f"{path} is not a kvchat job file ({reason}); it is left as it is",
                         f"a job is what kvchat ask leaves in {jobs_folder()} for its reading in the background")
