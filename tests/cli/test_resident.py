"""The model kept loaded between `kvchat ask`s (cli/resident.py) on the tiny GGUF: an ask after
one that kept it is answered by it as the ask would answer itself, Ctrl-C stops that answer and
not the kept model, which lets go after its keep-alive (or once an ask's 0 says so), one a model."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from kvchat.cli.resident import Kept, keep_alive_s
from kvchat.errors import KvchatError

from tests.cli.test_cli import run_kvchat
from tests.tiny_gguf import write_tiny_gguf

TIMEOUT_S = 120


def ask_args(document: Path, model: Path, *more: str) -> list[str]:
    return ["ask", str(document), "What does item 7 cost?", "-m", str(model), "--no-cache", "--max-tokens", "6", "--json", *more]


@contextmanager
def kept_loaded(model: Path, home: Path, keep_alive: int = 60) -> Iterator[subprocess.Popen[bytes]]:
    """A `kvchat resident` made as an ask of ask_args() makes its engine, once it listens."""
    command = [sys.executable, "-m", "kvchat.cli", "resident", "--model", str(model), "--keep-alive", str(keep_alive),
               "--no-cache", "--draft", "none", "--draft-when-needed"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, bufsize=0, env={**os.environ, "KVCHAT_HOME": str(home)})
    try:
        assert f"kept {model} loaded for {keep_alive} s" in next_line(process)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(TIMEOUT_S)


def next_line(process: subprocess.Popen[bytes]) -> str:
    """The next line the kept model logs (its stderr, unbuffered: what select sees is all there is)."""
    assert select.select([process.stderr], [], [], TIMEOUT_S)[0], "the kept model said nothing"
    return process.stderr.readline().decode()


def answer_fields(stdout: str) -> dict[str, object]:
    record = json.loads(stdout)
    return {name: value for name, value in record.items() if not name.endswith(("_s", "_per_s"))}


@pytest.mark.system
def test_an_ask_is_answered_by_the_kept_model_as_it_would_answer_itself(
    tiny_model_path: Path, document: Path, isolated_home: Path, tmp_path: Path,
) -> None:
    alone = run_kvchat(*ask_args(document, tiny_model_path), home=tmp_path / "another-home")  # no model kept there
    with kept_loaded(tiny_model_path, isolated_home) as kept:
        relayed = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home, env={"KVCHAT_KEEP_ALIVE": "60"})
        assert "answered a question about" in next_line(kept)
        last = run_kvchat(*ask_args(document, tiny_model_path, "--keep-alive", "0"), home=isolated_home)
        assert "answered a question about" in next_line(kept)
        assert kept.wait(TIMEOUT_S) == 0 and "let go, as its last ask said" in kept.stderr.read().decode()
    assert alone.returncode == relayed.returncode == last.returncode == 0, (alone.stderr, relayed.stderr)
    assert answer_fields(relayed.stdout) == answer_fields(alone.stdout) == answer_fields(last.stdout)
    assert relayed.stderr.splitlines()[:-1] == alone.stderr.splitlines()[:-1]  # its sources; the stats' times differ
    assert not Kept(str(tiny_model_path), 0, False, None, False).socket_path().exists()


@pytest.mark.system
def test_ctrl_c_stops_the_kept_models_answer_and_not_the_kept_model(tmp_path: Path, isolated_home: Path) -> None:
    """As test_cli's Ctrl-C test: the signal goes once the reading's progress bar shows (stderr is a
    terminal), the bar drawn from the kept model's progress."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    document = tmp_path / "long.txt"
    document.write_text("All work and no play makes a dull model. " * 600)
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home), "KVCHAT_KEEP_ALIVE": "60"}
    with kept_loaded(model, isolated_home) as kept:
        terminal, stderr_end = pty.openpty()
        asking = subprocess.Popen([sys.executable, "-m", "kvchat.cli", *ask_args(document, model)], stdout=subprocess.PIPE,
                                  stderr=stderr_end, env=env)
        os.close(stderr_end)
        shown = b""
        while b"reading" not in shown:
            assert select.select([terminal], [], [], TIMEOUT_S)[0], f"no progress bar: {shown!r}"
            shown += os.read(terminal, 4096)
        asking.send_signal(signal.SIGINT)
        while chunk := _read_or_closed(terminal):
            shown += chunk
        os.close(terminal)
        assert asking.wait(timeout=TIMEOUT_S) == 130
        stderr = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode())
        assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "kvchat: stopped"
        assert "answered a question about" in next_line(kept)
        after = run_kvchat(*ask_args(document, model), home=isolated_home, env={"KVCHAT_KEEP_ALIVE": "60"})
        assert after.returncode == 0 and "answered a question about" in next_line(kept)
        assert kept.poll() is None


def _read_or_closed(terminal: int) -> bytes:
    try:
        return os.read(terminal, 4096)
    except OSError:  # Linux says EIO once the program closed its terminal
        return b""


@pytest.mark.system
def test_a_kept_model_lets_go_after_its_keep_alive_and_only_one_process_keeps_it(
    tiny_model_path: Path, isolated_home: Path,
) -> None:
    with kept_loaded(tiny_model_path, isolated_home, keep_alive=3) as kept:
        second = subprocess.run([sys.executable, "-m", "kvchat.cli", "resident", "--model", str(tiny_model_path),
                                 "--keep-alive", "3", "--no-cache", "--draft", "none", "--draft-when-needed"],
                                capture_output=True, text=True, env={**os.environ, "KVCHAT_HOME": str(isolated_home)},
                                timeout=TIMEOUT_S)
        assert second.returncode == 0 and second.stderr == ""  # the first keeps it: the second leaves at once
        socket_path = str(Kept(str(tiny_model_path), 0, False, None, False).socket_path())
        Client(socket_path, family="AF_UNIX").close()  # gone before it asked
        assert "could not read a request: EOFError()" in next_line(kept)
        with closing(Client(socket_path, family="AF_UNIX")) as stranger:
            stranger.send(("hello",))
            assert "left a request it does not know unanswered" in next_line(kept)
        assert kept.wait(TIMEOUT_S) == 0 and "let go after its keep-alive" in kept.stderr.read().decode()


@pytest.mark.system
def test_an_ask_that_answered_itself_leaves_its_model_kept(tiny_model_path: Path, document: Path, isolated_home: Path) -> None:
    asked = run_kvchat(*ask_args(document, tiny_model_path, "--keep-alive", "30"), home=isolated_home)
    assert asked.returncode == 0, asked.stderr
    started = _residents_of(tiny_model_path)
    try:
        assert [command[command.index("resident"):] for _, command in started] == [[
            "resident", "--model", str(tiny_model_path), "--gpu-layers", "0", "--keep-alive", "30", "--no-cache",
            "--draft", "none", "--draft-when-needed"]]
    finally:
        for pid, _ in started:
            os.kill(pid, signal.SIGKILL)
            _await_exit(pid)


def _residents_of(model: Path) -> list[tuple[int, list[str]]]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().decode().split("\0")[:-1] if proc.name.isdigit() else []
        except OSError:  # ended meanwhile
            continue
        if "resident" in command and str(model) in command:
            found.append((int(proc.name), command))
    return found


def _await_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], TIMEOUT_S)[0]
    finally:
        os.close(fd)


def test_keep_alive_is_the_option_else_the_environment_else_five_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVCHAT_KEEP_ALIVE")
    assert (keep_alive_s(7), keep_alive_s(None)) == (7, 300)
    monkeypatch.setenv("KVCHAT_KEEP_ALIVE", "0")
    assert (keep_alive_s(7), keep_alive_s(None)) == (7, 0)
    monkeypatch.setenv("KVCHAT_KEEP_ALIVE", "5m")
    with pytest.raises(KvchatError, match="KVCHAT_KEEP_ALIVE is '5m', not a number of seconds"):
        keep_alive_s(None)


def test_no_model_is_kept_where_the_sockets_folder_is_not_the_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    kept = Kept("default", 0, True, None, False)
    folder = tmp_path / f"kvchat-{os.getuid()}"
    assert kept.socket_path().parent == folder and folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o777)  # another user could have put a socket of theirs there
    assert kept.socket_path() is None
    folder.chmod(0o700)
    folder.rmdir()
    folder.symlink_to(tmp_path)
    assert kept.socket_path() is None


def test_a_kept_model_is_another_for_another_kvchat_home_model_or_draft(isolated_home: Path, monkeypatch) -> None:
    kept = Kept("default", 0, True, None, False)
    others = [Kept("small", 0, True, None, False), Kept("default", 99, True, None, False), Kept("default", 0, False, None, False),
              Kept("default", 0, True, "small", False), Kept("default", 0, True, None, True)]
    here = kept.socket_path()
    assert len({here} | {other.socket_path() for other in others}) == len(others) + 1
    assert Kept("default", 0, True, None, False).socket_path() == here
    monkeypatch.setenv("KVCHAT_HOME", str(isolated_home / "elsewhere"))
    assert kept.socket_path() != here
