"""kvchat's own folders when they turn hostile, in real processes on the tiny model: KVCHAT_HOME
read-only or full, a lock file that is not kvchat's, a dead writer's temp file beside the saved
readings, another process holding the lock the questions share. Each ends in one line naming what
is wrong and what to do, never a traceback, and nothing the user saved is lost or half-written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import ask_args, run_kvchat

pytestmark = pytest.mark.system


@pytest.fixture
def document(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(120)))
    return path


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failure ends in (the test fails on a traceback or anything more)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["folder", "dangling link", "link to a missing file", "link to a file"])
def test_a_lock_file_that_is_not_kvchats_is_refused_in_one_line_and_never_followed(
    kind, document, tiny_model_path, tmp_path, isolated_home,
) -> None:
    lock = isolated_home / "cache" / "reading" / "foreground.lock"
    lock.parent.mkdir(parents=True)
    victim, missing = tmp_path / "passwd", tmp_path / "missing"
    victim.write_text("root:x:0:0:root:/root:/bin/sh\n")
    victim.chmod(0o644)
    if kind == "folder":
        lock.mkdir()
    else:
        lock.symlink_to({"dangling link": tmp_path / "nowhere" / "x", "link to a missing file": missing,
                         "link to a file": victim}[kind])
    result = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    what = "a folder" if kind == "folder" else "a symbolic link"
    assert result.returncode == 1 and error_line(result) == (
        f"kvchat: error: {lock} is {what}, not a file kvchat made (hint: remove it, and kvchat makes its own anew)")
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/sh\n" and victim.stat().st_mode & 0o777 == 0o644
    assert not missing.exists()
