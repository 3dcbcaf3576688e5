"""The lock files kvchat opens in its own folders (the questions' foreground.lock, a reading's
`<key>.lock`, the background readings' turn.lock, the memos' `.lock`): a lock file is never opened
through a symbolic link nor made where a link points, and anything but a plain file there is
refused in one line naming it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvchat.engine.kvcache.foreground import Foreground
from kvchat.engine.kvcache.in_progress import ReadingsInProgress
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.paths import HomeError

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
