"""Progress records of readings in progress (`<cache>/reading/<key>.json`) are read, never trusted:
`kvchat cache stop` signals a record's process only when the record is exactly what kvchat writes
(its key kvchat's hash form and its file's name, a positive pid, counts and times of their types)
and that process holds the reading's lock. Anything else is removed and reported.

No test here sends a signal: os.kill is replaced by a recorder, and `kvchat` runs in this process
(as root on CI, a kill(-1) would end every process of the machine)."""

from __future__ import annotations

import fcntl
import json
import os
import reprlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvchat.cli import app as cli_app
from kvchat.cli.app import main
from kvchat.engine import readings_in_progress
from kvchat.engine.kvcache import in_progress, lock_files

KEY = "0123456789abcdef0123456789abcdef01234567"  # the form of DocumentStates.key()
SEND_SIGNAL = os.kill  # for the tests' own child processes only


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every os.kill / os.killpg call made, none of them sent."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: calls.append((pid, signum)))
    monkeypatch.setattr(os, "killpg", lambda pgid, signum: calls.append((-pgid, signum)))
    return calls


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process kvchat did not start (a forged record names it)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield process
    SEND_SIGNAL(process.pid, signal.SIGKILL)  # os.kill may be the recorder still
    process.wait()


def kvchat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`kvchat args` run in this process: (exit code, stdout, stderr). Its logging is left as the
    tests have it: configured, kvchat's log lines would leave caplog for the rest of the session."""
    monkeypatch.setattr(sys, "argv", ["kvchat", *args])
    monkeypatch.setattr(cli_app, "configure_logging", lambda: None)
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def held_lock(path: Path) -> int:
    """An fd holding an flock on `path`, as a reading's process holds its lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def record(key: str = KEY, **fields: object) -> dict[str, object]:
    return {"key": key, "document": "x", "model": "m", "pid": os.getpid(), "done": 1, "total": 2, "started": 1,
            "updated": 2, "queued": False, "stoppable": True, **fields}


def write_record(name: str, data: object) -> Path:
    path = readings_in_progress().root / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.system
def test_a_key_that_leaves_the_reading_folder_is_removed_and_its_process_left_alone(
    tmp_path, bystander, kills, monkeypatch, capsys,
) -> None:
    outside = tmp_path / "x" / "held.lock"
    fd = held_lock(outside)
    try:
        forged = write_record("forged", record(key=os.path.relpath(outside.with_suffix(""), readings_in_progress().root),
                                               pid=bystander.pid))
        code, out, err = kvchat(monkeypatch, capsys, "cache", "stop")
    finally:
        os.close(fd)
    assert (code, out) == (0, "no reading in progress\n") and kills == []
    assert err.startswith(f"kvchat: removed {forged}: not a record of a kvchat reading (key ")
    assert not forged.exists() and outside.exists() and bystander.poll() is None
    assert sorted(p.name for p in readings_in_progress().root.iterdir()) == []


@pytest.mark.parametrize("fields, reason", [
    ({"pid": -1}, "pid is -1"),
    ({"pid": 0}, "pid is 0"),
    ({"pid": 99999999999999999999}, "pid is 99999999999999999999"),
    ({"pid": True}, "pid is True"),
    ({"pid": "1"}, "pid is '1'"),
    ({"started": "s"}, "started is 's'"),
    ({"done": 2.5}, "done is 2.5"),
    ({"read_from": -1}, "read_from is -1"),
    ({"read_s": True}, "read_s is True"),
    ({"updated": float("nan")}, "updated is nan"),
    ({"document": None}, "document is None"),
    ({"key": "0" * 40}, "key '0000000000000000000000000000000000000000' is not its file's name"),
    ({"key": KEY.upper()}, f"key is {reprlib.repr(KEY.upper())}"),
])
def test_a_record_of_the_wrong_shape_is_removed_reported_and_never_signalled(
    fields, reason, kills, monkeypatch, capsys,
) -> None:
    """Its lock is held (by this process), as a damaged record's reading's would be."""
    fd = held_lock(readings_in_progress().root / f"{KEY}.lock")
    try:
        for command in (["cache", "list", "--json"], ["cache", "list"], ["cache", "stop"]):
            path = write_record(KEY, record(**fields))
            code, out, err = kvchat(monkeypatch, capsys, *command)
            assert code == 0 and not path.exists() and kills == []
            assert err == f"kvchat: removed {path}: not a record of a kvchat reading ({reason})\n"
            assert out == "[]\n" if "--json" in command else "reading in the background" not in out
    finally:
        os.close(fd)


def test_a_record_without_its_reading_time_is_listed_with_no_time_left(monkeypatch, capsys) -> None:
    """A record an earlier kvchat wrote (no read_from, no read_s) is kvchat's still."""
    fd = held_lock(readings_in_progress().root / f"{KEY}.lock")
    try:
        write_record(KEY, record(done=1, total=2))
        code, out, err = kvchat(monkeypatch, capsys, "cache", "list", "--json")
    finally:
        os.close(fd)
    assert (code, err) == (0, "")
    assert [(entry["state"], entry["done"], entry["left_s"]) for entry in json.loads(out)] == [("reading", 1, None)]


def test_a_reading_followed_in_another_process_shows_the_speed_of_its_reading_time(monkeypatch) -> None:
    """What a question awaiting another process's reading shows (progress_of): the speed of the
    400 tokens read in 4 s since the 100 loaded, not of every token over its wall time (98 s)."""
    monkeypatch.setattr(in_progress, "PROGRESS_EVERY_S", 0.01)
    fd = held_lock(readings_in_progress().root / f"{KEY}.lock")
    try:
        write_record(KEY, record(done=500, total=1000, started=100, updated=198, read_from=100, read_s=4.0))
        progress = next(readings_in_progress().progress_of(KEY, threading.Event()))
    finally:
        os.close(fd)
    assert (progress.done, progress.total, progress.read_from, progress.elapsed_s) == (500, 1000, 100, 4.0)
    assert progress.tokens_per_s == 100.0


@pytest.mark.system
def test_a_record_whose_process_does_not_hold_the_lock_is_not_signalled(bystander, kills, monkeypatch, capsys) -> None:
    """The lock is held, but by this process, not the one the record names."""
    fd = held_lock(readings_in_progress().root / f"{KEY}.lock")
    try:
        path = write_record(KEY, record(pid=bystander.pid))
        code, out, err = kvchat(monkeypatch, capsys, "cache", "stop")
    finally:
        os.close(fd)
    assert (code, out, kills) == (0, "no reading in progress\n", [])
    assert err == f"kvchat: removed {path}: not a record of a kvchat reading (process {bystander.pid} does not hold the reading's lock)\n"
    assert bystander.poll() is None


def test_the_process_holding_a_readings_lock_is_asked_to_stop(kills, monkeypatch, capsys) -> None:
    """What the checks let through: kvchat's own record, its process holding the lock."""
    claim = readings_in_progress().claim(KEY, "notes.txt", "m", 100)
    assert claim is not None
    with claim:
        code, out, err = kvchat(monkeypatch, capsys, "cache", "stop")
    assert (code, err, kills) == (0, "", [(os.getpid(), signal.SIGTERM)])
    assert out == "stopped the reading of notes.txt (0 of 100 tokens read)\n"


def test_a_readings_lock_file_goes_when_it_ends() -> None:
    readings = readings_in_progress()
    with readings.claim(KEY, "notes.txt", "m", 100):
        assert sorted(path.name for path in readings.root.iterdir()) == [f"{KEY}.json", f"{KEY}.lock"]
        assert readings.claim(KEY, "notes.txt", "m", 100) is None  # one reader at a time
    assert list(readings.root.iterdir()) == []


def test_lock_files_left_behind_are_removed_unless_held() -> None:
    """A reader killed between its record and its lock file, or an earlier kvchat, left them."""
    readings = readings_in_progress()
    readings.root.mkdir(parents=True)
    left = readings.root / f"{'a' * 40}.lock"
    left.touch()
    fd = held_lock(readings.root / f"{KEY}.lock")  # a reader about to write its record
    try:
        assert readings.entries() == []
        assert sorted(path.name for path in readings.root.iterdir()) == [f"{KEY}.lock"]
    finally:
        os.close(fd)


def test_a_lock_file_removed_while_another_process_locks_it_is_locked_anew(monkeypatch) -> None:
    """The reader removes its lock file holding the lock; one who opened that file just before
    locks a file no longer in the folder, sees it, and locks the file now there instead."""
    path = readings_in_progress().root / f"{KEY}.lock"
    path.parent.mkdir(parents=True)
    real_flock, removed_first = fcntl.flock, []

    def flock_after_the_reader_removed_it(fd: int, operation: int) -> None:
        if not removed_first:
            removed_first.append(os.fstat(fd).st_ino)
            path.unlink()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_reader_removed_it)
    fd = lock_files.lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB, create=True)
    assert fd is not None
    try:
        assert os.fstat(fd).st_ino == path.stat().st_ino and removed_first
    finally:
        os.close(fd)
