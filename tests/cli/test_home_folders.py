"""kvchat's own folders when they turn hostile, in real processes on the tiny model: KVCHAT_HOME
read-only or full, a lock file that is not kvchat's, a dead writer's temp file beside the saved
readings, another process holding the lock the questions share. Each ends in one line naming what
is wrong and what to do, never a traceback, and nothing the user saved is lost or half-written."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_cli import ask_args, run_kvchat
from tests.system_tools import on_tmpfs, read_only_home

pytestmark = pytest.mark.system


def run_in(prefix: list[str], *args: str, home: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`kvchat args` run through `prefix` (system_tools.on_tmpfs), KVCHAT_HOME `home`."""
    env = {**os.environ, "KVCHAT_HOME": str(home)}
    return subprocess.run([*prefix, sys.executable, "-m", "kvchat.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failure ends in (the test fails on a traceback or anything more)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["ask", "read", "inspect", "serve"])
def test_a_read_only_home_is_refused_in_one_line_naming_its_folder(command, document, tiny_model_path, tmp_path) -> None:
    home = tmp_path / "home"
    prefix = read_only_home(home)
    model = ["--model", str(tiny_model_path)]
    args = {"ask": ask_args(document, tiny_model_path), "read": ["read", str(document), *model],
            "inspect": ["inspect", str(document), *model], "serve": ["serve", *model]}[command]
    result = run_in(prefix, *args, home=home)
    line = error_line(result)
    assert result.returncode == 1 and line.startswith(f"kvchat: error: cannot write in {home / 'cache'} (")
    assert f"it is under KVCHAT_HOME ({home}): make it writable, set KVCHAT_HOME to a folder that is" in line
    assert ("or ask with --no-cache" in line) is (command == "ask")


def test_without_the_cache_a_read_only_home_still_answers(document, tiny_model_path, tmp_path) -> None:
    home = tmp_path / "home"
    prefix = read_only_home(home)
    result = run_in(prefix, *ask_args(document, tiny_model_path, "--read", "full", "--no-cache", "--json"), home=home)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["prompt_tokens"] > 0 and "Traceback" not in result.stderr


def test_without_the_cache_an_ask_writes_only_the_lock_that_pauses_background_readings(
    document, tiny_model_path, isolated_home,
) -> None:
    result = run_kvchat(*ask_args(document, tiny_model_path, "--read", "full", "--no-cache"), home=isolated_home)
    assert result.returncode == 0, result.stderr
    written = sorted(str(path.relative_to(isolated_home)) for path in isolated_home.rglob("*") if path.is_file())
    assert written == ["cache/reading/foreground.lock", "logs/kvchat.log"]  # no model digest, no memo


def test_read_on_a_full_disk_fails_saves_nothing_and_leaves_no_partial_file(document, tiny_model_path, tmp_path) -> None:
    home = tmp_path / "home"
    prefix = on_tmpfs(home, "size=300k")  # the tiny model's reading of the document is 0.8 MiB
    listing = 'python="$1"; shift; "$python" "$@"; code=$?; find "$KVCHAT_HOME" -type f; exit $code'
    result = run_in([*prefix, "sh", "-c", listing, "sh"], "read", str(document), "--model", str(tiny_model_path), home=home)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert "kvchat: could not save the reading for next time (No space left on device)" in lines
    assert lines[-2:] == [f"{document}: read, but its reading could not be saved", "1 could not be saved"]
    assert not [name for name in result.stdout.split() if "/states/" in name]  # no saved reading, whole or half


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


WRITER = """
import sys, time
from kvchat.atomic import atomic_file
from kvchat.engine import state_store
with atomic_file(state_store().path_for(sys.argv[1])) as out:
    out.write(b"x" * 2**20)  # a reading being saved
    out.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


def _writer(key: str, home: Path) -> subprocess.Popen[str]:
    """A process saving a reading under `key`, stopped in the middle of its write."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, key], env={**os.environ, "KVCHAT_HOME": str(home)},
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    return writer


def test_a_killed_writers_temp_file_goes_at_the_next_start_and_a_live_writers_stays(isolated_home) -> None:
    states = isolated_home / "cache" / "states"
    killed, live = _writer("a" * 40, isolated_home), _writer("b" * 40, isolated_home)
    try:
        killed.kill()  # SIGKILL mid-save, as `kvchat read --job` killed while it writes
        killed.wait(30)
        assert len(list(states.glob(f"{'a' * 40}.kvstate.*.tmp"))) == 1
        listed = run_kvchat("cache", "list", "--json", home=isolated_home)
        assert listed.returncode == 0 and json.loads(listed.stdout) == []
        assert [path.name.split(".")[0] for path in states.glob("*.tmp")] == ["b" * 40]  # the live writer's stays
    finally:
        live.kill()
        live.wait(30)
    assert run_kvchat("cache", "list", home=isolated_home).returncode == 0
    assert list(states.glob("*.tmp")) == []


def _line_within(stream, seconds: float) -> str:
    """The next line of `stream`, or "" when none comes within `seconds`."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else ""


def test_an_ask_kept_waiting_by_another_process_holding_the_questions_lock_says_so(
    document, tiny_model_path, isolated_home,
) -> None:
    lock = isolated_home / "cache" / "reading" / "foreground.lock"
    lock.parent.mkdir(parents=True)
    held = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # this test's process holds it, as `flock -x … sleep 45` would
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    command = [sys.executable, "-m", "kvchat.cli", *ask_args(document, tiny_model_path)]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as ask:
        try:
            started = time.monotonic()
            line = _line_within(ask.stderr, 60)
            name = Path("/proc/self/comm").read_text().strip()
            assert line == (f"kvchat: waiting for process {os.getpid()} ({name}) to release "
                            f"{lock}, which kvchat's questions share; end it (kill {os.getpid()}) to go on, or press "
                            "Ctrl-C to stop\n"), line
            assert time.monotonic() - started >= 1  # not at once: a background reading's look holds it a moment
            assert ask.poll() is None  # still waiting
        finally:
            os.close(held)  # the ask goes on now (and ends, where the test failed)
        _, rest = ask.communicate(timeout=120)
    assert ask.returncode == 0 and "waiting" not in rest, rest
