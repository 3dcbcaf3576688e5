"""The lock files kvchat opens in its own folders (the questions' foreground.lock, a reading's
`<key>.lock`, the background readings' turn.lock, the memos' `.lock`), and its folders when they
cannot be written: a lock file is never opened through a symbolic link nor made where a link
points, anything but a plain file there is refused in one line naming it, and a folder that cannot
be written is named with where it comes from (KVCHAT_HOME)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvchat.engine.kvcache import foreground as foreground_module
from kvchat.engine.kvcache.foreground import WAIT_TOLD_S, Foreground
from kvchat.engine.kvcache.in_progress import ReadingsInProgress
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.paths import HomeError, as_home_error, checked_writable, unwritable

KEY = "0123456789abcdef0123456789abcdef01234567"  # the form of DocumentStates.key()

# Each lock file kvchat opens, and what opens it.
LOCKS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "the questions'": ("foreground.lock", lambda root: Foreground(root).answering().__enter__()),
    "a reading's": (f"{KEY}.lock", lambda root: ReadingsInProgress(root).claim(KEY, "notes.txt", "model", 100)),
    "the background readings' turn": ("turn.lock", lambda root: ReadingsInProgress(root).turn()),
    "a memo's": ("speeds.json.lock", lambda root: ReadingSpeeds(root / "speeds.json", "model").record("read", 1024, 1.0)),
}


def _put(kind: str, lock: Path, victim: Path, missing: Path) -> None:
    """Something that is not kvchat's lock file where `lock` belongs."""
    if kind == "folder":
        lock.mkdir()
    else:
        lock.symlink_to({"dangling link": missing.parent / "nowhere" / "x", "link to a missing file": missing,
                         "link to a file": victim}[kind])


@pytest.mark.parametrize("which", sorted(LOCKS))
@pytest.mark.parametrize("kind", ["folder", "dangling link", "link to a missing file", "link to a file"])
def test_a_lock_file_that_is_not_a_plain_file_is_refused_naming_it_and_never_followed(which, kind, tmp_path) -> None:
    root = tmp_path / "reading"
    root.mkdir()
    name, opens = LOCKS[which]
    victim, missing = tmp_path / "passwd", tmp_path / "missing"
    victim.write_text("root:x:0:0:root:/root:/bin/sh\n")
    victim.chmod(0o644)
    _put(kind, root / name, victim, missing)
    with pytest.raises(HomeError) as refused:
        opens(root)
    what = "a folder" if kind == "folder" else "a symbolic link"
    assert refused.value.one_line() == (f"{root / name} is {what}, not a file kvchat made "
                                        "(hint: remove it, and kvchat makes its own anew)")
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/sh\n" and victim.stat().st_mode & 0o777 == 0o644
    assert not missing.exists()  # nothing made where a link points


def test_a_question_kept_from_the_foreground_lock_says_once_what_it_waits_for(tmp_path) -> None:
    foreground = Foreground(tmp_path)
    held = os.open(tmp_path / "foreground.lock", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # as `flock -x foreground.lock sleep 45` holds it
    told: list[str] = []
    answering, answered = threading.Event(), threading.Event()

    def ask() -> None:
        with foreground.answering(told=told.append):
            answering.set()
            answered.wait(10)

    threading.Thread(target=ask, daemon=True).start()
    try:
        assert not answering.wait(WAIT_TOLD_S + 1)  # kept waiting, and told so after a second
        assert told == [f"waiting for another process to release {foreground.path}, which kvchat's questions share; "
                        "end that process to go on"]  # this process's own pid is not named: it is not "another"
    finally:
        os.close(held)
    assert answering.wait(10) and len(told) == 1
    answered.set()


def test_a_process_holding_the_foreground_lock_is_named_with_how_to_end_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(foreground_module, "holders", lambda path: {4242, os.getpid()})
    monkeypatch.setattr(foreground_module, "process_name", lambda pid: "flock")
    line = Foreground(tmp_path).waiting_for()
    assert line == (f"waiting for process 4242 (flock) to release {tmp_path / 'foreground.lock'}, which kvchat's "
                    "questions share; end it (kill 4242) to go on")


def test_where_the_lock_file_cannot_be_made_a_question_goes_on_without_it(tmp_path, monkeypatch) -> None:
    """`ask --no-cache` on a read-only KVCHAT_HOME: no background reading can run there either."""
    def read_only(path: Path, create: bool = True) -> int | None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(foreground_module, "open_lock_file", read_only)
    foreground = Foreground(tmp_path)
    with foreground.answering():
        assert not foreground.busy()
    assert not foreground.busy()


def test_a_folder_that_cannot_be_written_is_named_with_kvchat_home(isolated_home, monkeypatch) -> None:
    folder = isolated_home / "cache"
    error = unwritable(folder, OSError(errno.EROFS, "Read-only file system"), also="ask with --no-cache")
    assert error.one_line() == (f"cannot write in {folder} (Read-only file system) (hint: it is under KVCHAT_HOME "
                                f"({isolated_home}): make it writable, set KVCHAT_HOME to a folder that is, or ask "
                                "with --no-cache)")
    full = unwritable(folder, OSError(errno.ENOSPC, "No space left on device"))
    assert full.hint == (f"it is under KVCHAT_HOME ({isolated_home}): free some space there (kvchat cache clear removes "
                         "the saved readings), set KVCHAT_HOME to a folder on another disk")
    monkeypatch.delenv("KVCHAT_HOME")
    assert unwritable(folder, OSError(errno.EACCES, "Permission denied")).hint == (
        "kvchat keeps its files there (KVCHAT_HOME is not set): make it writable, set KVCHAT_HOME to a folder kvchat "
        "may write in")


def test_an_unforeseen_write_in_kvchats_folders_is_named_and_others_are_not(isolated_home, tmp_path) -> None:
    inside = isolated_home / "cache" / "states"
    inside.mkdir(parents=True)
    named = as_home_error(OSError(errno.EROFS, "Read-only file system", str(inside / "k.kvstate")))
    assert named is not None and named.message == f"cannot write in {inside} (Read-only file system)"
    assert as_home_error(OSError(errno.EROFS, "Read-only file system", str(tmp_path / "mine.txt"))) is None
    assert as_home_error(OSError(errno.EIO, "Input/output error", str(inside / "k.kvstate"))) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder without write permission")
def test_a_folder_without_write_permission_is_refused_at_once(isolated_home) -> None:
    isolated_home.chmod(0o555)
    try:
        with pytest.raises(HomeError, match=re.escape(f"cannot write in {isolated_home / 'cache'} (Permission denied)")):
            checked_writable(isolated_home / "cache")
    finally:
        isolated_home.chmod(0o755)
