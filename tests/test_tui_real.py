"""The chat app on the real default model: once under Pilot, once in a real terminal (tmux)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from textual.widgets import Input

from kvchat.tui.app import KvchatApp
from kvchat.tui.sessions import EngineSessions
from kvchat.tui.widgets import AnswerView
from test_tui import wait_for

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


async def test_pilot_on_the_default_model_answers_from_the_document(default_model_path: Path, notes: Path) -> None:
    app = KvchatApp(EngineSessions(str(default_model_path), use_cache=False), notes)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.session is not None, timeout_s=300)
        app.query_one("#question", Input).value = "What was the name of the boat?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.busy is None and app._answer is None, timeout_s=300)
        assert "Grey Heron" in app.query_one(AnswerView).source
        assert app.query_one("KvPanel").figures.ttft_s > 0
    await asyncio.to_thread(app.close_engine)


def _tmux() -> str:
    """tmux from PATH, else from Debian's packages; skip only if it cannot be installed."""
    found = shutil.which("tmux")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "install", "-y", "-q", "tmux"], ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "tmux"]):
            subprocess.run(command, env=env, capture_output=True, timeout=600)
            if shutil.which("tmux"):
                return shutil.which("tmux")  # type: ignore[return-value]
    pytest.skip("tmux is not installed and could not be installed with apt-get (needs root and Debian's packages)")


class Terminal:
    """One tmux session on its own server socket, read with capture-pane."""

    def __init__(self, tmux: str, command: str, env: dict[str, str]) -> None:
        self.base = [tmux, "-L", f"kvchat-test-{uuid.uuid4().hex[:8]}"]
        self.env = env
        subprocess.run([*self.base, "new-session", "-d", "-s", "main", "-x", "120", "-y", "36", command], env=env, check=True)
        self.screens: list[str] = []

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "main", *keys], env=self.env, check=True)

    def screen(self) -> str:
        result = subprocess.run([*self.base, "capture-pane", "-p", "-t", "main"], env=self.env, capture_output=True, text=True)
        self.screens.append(result.stdout)
        return result.stdout

    def wait_for(self, condition, timeout_s: float, step: str = "") -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.screen()
            if condition(text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"{step}: not on screen after {timeout_s} s:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], env=self.env, capture_output=True)


def _answer_after(screen: str, question: str) -> str:
    return screen.split(question, 1)[1] if question in screen else ""


def test_a_real_terminal_session(default_model_path: Path, notes: Path) -> None:
    """As a new user would: open, two questions about different parts, Esc one answer, settings, quit."""
    kvchat = Path(sys.executable).parent / "kvchat"
    program = str(kvchat) if kvchat.exists() else shutil.which("kvchat")
    assert program, "the kvchat command is not installed"
    env = {**os.environ, "TERM": "xterm-256color"}
    command = f"'{program}' chat '{notes}' --model '{default_model_path}' --max-tokens 300; echo KVCHAT-EXITED $?; sleep 60"
    terminal = Terminal(_tmux(), command, env)
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
        terminal.wait_for(lambda s: "KVCHAT-EXITED 0" in s, timeout_s=60, step="exit")
    finally:
        terminal.close()
    seen = "\n".join(terminal.screens)
    assert "Traceback" not in seen
    assert "llama_" not in seen and "load_tensors" not in seen  # llama.cpp's logs go to the log file
