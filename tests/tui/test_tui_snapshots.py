"""Layout snapshots of the chat app on the fake engine (SVGs in tests/tui/__snapshots__).

After a deliberate layout change: `python -m pytest tests/tui/test_tui_snapshots.py --snapshot-update`,
then look at the new SVGs before committing them.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from tests.fake_sessions import FakeSessions
from kvchat.tui.app import KvchatApp
from kvchat.tui.screens import SettingsScreen
from tests.tui.test_tui import wait_for

SIZE = (110, 32)


async def _answered(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.session is not None)
    app.query_one("#question", Input).value = "What was the boat called?"
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.busy is None and app._answer is None)
    app.query_one("#question", Input).cursor_blink = False  # drawn whatever the blink's phase when the snapshot is taken
    await pilot.wait_for_scheduled_animations()


def test_chat_after_an_answer(snap_compare) -> None:
    assert snap_compare(KvchatApp(FakeSessions(), [Path("notes.txt")]), terminal_size=SIZE, run_before=_answered)


def test_settings_dialog(snap_compare) -> None:
    async def open_settings(pilot) -> None:
        await _answered(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(KvchatApp(FakeSessions(), [Path("notes.txt")]), terminal_size=SIZE, run_before=open_settings)
