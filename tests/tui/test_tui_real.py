"""The chat app on the small real model: once under Pilot, once in a real terminal (tmux)."""

from __future__ import annotations

import asyncio
import os
import select
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kvchat.tui.app import KvchatApp
from kvchat.tui.sessions import EngineSessionFactory
from kvchat.tui.widgets import AnswerView
from tests.system_tools import system_tool
from tests.tui.test_tui import ask

pytestmark = pytest.mark.real_model

NOTES = """Field notes from the Larkspur expedition

Day 1. The team met at the harbour of Port Ellery at dawn. Our guide, Marta Quintero, checked the
supplies: twelve crates of food, four tents and a radio. The boat, named the Grey Heron, left at 7:40.

Day 2. We reached the island of Vell in the afternoon. The old lighthouse keeper told us the spring
water is safe to drink. We camped near the northern cliffs.

Day 3. Heavy rain. We stayed in the tents and catalogued the bird species seen so far: 23 in total,
including two pairs of puffins.

Day 4. The radio failed at noon. Marta repaired it with a spare fuse from crate number 9.

Day 5. We returned to Port Ellery at 18:15. The expedition budget closed at 4,350 euros.
"""


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    path = tmp_path / "trip.txt"
    path.write_text(NOTES, encoding="utf-8")
    return path


async def test_pilot_on_the_small_model_answers_from_the_document(small_model_path: Path, notes: Path) -> None:
    app = KvchatApp(EngineSessionFactory(str(small_model_path), use_cache=False), [notes])
    async with app.run_test(size=(120, 40)) as pilot:
        await ask(pilot, app, "What was the name of the boat?", timeout_s=300)
        assert "Grey Heron" in app.query_one(AnswerView).source
        assert app.query_one("KvPanel").figures.ttft_s > 0
    await asyncio.to_thread(app.close_engine)


class Terminal:
    """A program in a tmux session on its own server socket. What it writes to its terminal is
    piped (pipe-pane) into a FIFO the test blocks on: the screen (capture-pane) is looked at each
    time the program wrote to it, never on a timer. The program starts once the pipe is in place;
    when it ends, its exit status is written to a file and the tmux channel `exited` is signalled
    (tmux wait-for). The status goes through a file, not the screen: tmux may mark the pane dead
    before it has drawn the last bytes the shell wrote."""

    def __init__(self, tmux: str, command: str, env: dict[str, str], fifo: Path) -> None:
        self.base = [tmux, "-L", f"kvchat-test-{uuid.uuid4().hex[:8]}"]
        self.env = env
        self.screens: list[str] = []
        self._status = fifo.with_suffix(".status")
        os.mkfifo(fifo)
        self._output = os.open(fifo, os.O_RDWR)  # read and write: never at end of file while the pipe is swapped
        script = f"{tmux} wait-for started; {command}; echo $? > {shlex.quote(str(self._status))}; {tmux} wait-for -S exited"
        self._tmux("new-session", "-d", "-s", "main", "-x", "120", "-y", "36", script)
        self._tmux("set-option", "-w", "-t", "main", "remain-on-exit", "on")  # its last screen stays to be read
        self._tmux("pipe-pane", "-O", "-t", "main", f"cat > {shlex.quote(str(fifo))}")
        self._tmux("wait-for", "-S", "started")

    def _tmux(self, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], env=self.env, check=True, capture_output=True, text=True, timeout=timeout_s)

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "main", *keys)

    def screen(self) -> str:
        self.screens.append(self._tmux("capture-pane", "-p", "-t", "main").stdout)
        return self.screens[-1]

    def wait_for(self, condition: Callable[[str], bool], timeout_s: float, step: str = "") -> str:
        """The screen once `condition(screen)` holds, looked at again after each write."""
        deadline = time.monotonic() + timeout_s
        while not condition(screen := self.screen()):
            written, _, _ = select.select([self._output], [], [], max(deadline - time.monotonic(), 0))
            if not written:
                raise AssertionError(f"{step}: not on screen after {timeout_s} s:\n{screen}")
            os.read(self._output, 1 << 16)
        return screen

    def wait_exited(self, timeout_s: float) -> int:
        """The program's exit status, once it ended (its last screen joins `screens`)."""
        self._tmux("wait-for", "exited", timeout_s=timeout_s)
        self.screen()
        return int(self._status.read_text())

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], env=self.env, capture_output=True)
        os.close(self._output)


def _answer_after(screen: str, question: str) -> str:
    return screen.split(question, 1)[1] if question in screen else ""


def test_a_real_terminal_session(small_model_path: Path, notes: Path, tmp_path: Path) -> None:
    """As a new user would: open, two questions about different parts, Esc one answer, settings, quit."""
    kvchat = Path(sys.executable).parent / "kvchat"
    program = str(kvchat) if kvchat.exists() else shutil.which("kvchat")
    assert program, "the kvchat command is not installed"
    env = {**os.environ, "TERM": "xterm-256color"}
    command = f"'{program}' chat '{notes}' --model '{small_model_path}' --max-tokens 300"
    terminal = Terminal(system_tool("tmux", "tmux"), command, env, tmp_path / "terminal-output")
    try:
        terminal.wait_for(lambda s: "Ready: ask about trip.txt" in s, timeout_s=300, step="ready")
        terminal.keys("What was the name of the boat?", "Enter")
        terminal.wait_for(lambda s: "Grey Heron" in _answer_after(s, "name of the boat?"), timeout_s=180, step="boat")
        terminal.wait_for(lambda s: "esc stops" not in s, timeout_s=30, step="idle")
        terminal.keys("How much was the expedition budget?", "Enter")
        terminal.wait_for(lambda s: "4,350" in _answer_after(s, "expedition budget?") or "4350" in _answer_after(s, "expedition budget?"), timeout_s=180, step="budget")
        terminal.wait_for(lambda s: "esc stops" not in s, timeout_s=30, step="idle")
        terminal.keys("Retell every day of the expedition in detail, with all the numbers.", "Enter")
        terminal.wait_for(lambda s: "Day" in _answer_after(s, "all the numbers."), timeout_s=180, step="retell")
        terminal.keys("Escape")
        terminal.wait_for(lambda s: "(stopped)" in s, timeout_s=60, step="stopped")
        terminal.wait_for(lambda s: "esc stops" not in s, timeout_s=30, step="idle")
        terminal.keys("C-s")
        terminal.wait_for(lambda s: "KV budget" in s and "Save" in s, timeout_s=30, step="settings")
        terminal.keys("Escape")
        terminal.wait_for(lambda s: "KV budget" not in s, timeout_s=30, step="settings closed")
        terminal.keys("C-q")
        assert terminal.wait_exited(timeout_s=60) == 0
    finally:
        terminal.close()
    seen = "\n".join(terminal.screens)
    assert "Traceback" not in seen
    assert "llama_" not in seen and "load_tensors" not in seen  # llama.cpp's logs go to the log file
