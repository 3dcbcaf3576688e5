"""File and document names are shown as typed, never read as Rich or Textual markup: a name like
'd[/]x.txt' broke `kvchat cache list` (MarkupError) and 'notes [final].txt' showed as 'notes .txt'."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Input, Label

from tests.fake_sessions import FakeSessions, fake_stats
from kvchat.cli.inspect import _table as inspect_table
from kvchat.cli.render import render
from kvchat.engine import AskSettings, ReadingPlan
from kvchat.engine.kvcache.store import StateStore, new_header
from kvchat.events import Done, Notice, Pruned
from kvchat.tui.app import KvchatApp
from kvchat.tui.screens import DocumentTree, KeptScreen, PickerScreen, SettingsScreen
from tests.tui.test_tui import SIZE, ask, wait_for

# A closing tag with nothing open, a word in brackets, a style, an escape: each read as markup before.
NAMES = ["d[/]x.txt", "notes [final].txt", "[red]alert.txt", "a\\[b]x.txt", "[bold]memo[/bold].md"]


def wide_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=250, color_system=None), out


def run_kvchat(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVCHAT_HOME": str(home), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "kvchat.cli", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.system
def test_cache_list_shows_the_saved_readings_names_as_typed(isolated_home: Path) -> None:
    store = StateStore(isolated_home / "cache" / "states")
    for number, name in enumerate(NAMES):
        payload = bytes([number]) * 10
        store.save(f"key{number}", new_header("m" * 64, f"p{number}", 5, payload, name, "tiny [q4_0]"), payload)
    result = run_kvchat("cache", "list", home=isolated_home)
    assert result.returncode == 0 and result.stderr == ""
    for name in NAMES:
        assert f" {name} " in result.stdout
    assert "tiny [q4_0]" in result.stdout and f"{len(NAMES)} saved" in result.stdout


@pytest.mark.system
def test_models_shows_a_kvchat_home_with_brackets_as_typed(tmp_path: Path) -> None:
    home = tmp_path / "home [x]"
    result = run_kvchat("models", home=home)
    assert result.returncode == 0 and result.stderr == ""
    assert f" {home / 'data' / 'models'}/" in result.stdout


def test_notices_and_the_kept_share_of_each_document_show_names_as_typed() -> None:
    console, out = wide_console()
    kept = tuple((name, 10 * number) for number, name in enumerate(NAMES))
    done = Done("", fake_stats(AskSettings(), 1))
    render([Notice(f"loaded the saved reading of {NAMES[0]}"), Pruned(10, 5, (), kept_by_document=kept), done], False, console)
    text = out.getvalue()
    assert f"kvchat: loaded the saved reading of {NAMES[0]}" in text
    assert "kept of each document: " + " · ".join(f"{name} {chars:,} chars" for name, chars in kept) in text


def test_inspect_shows_document_and_model_names_as_typed() -> None:
    console, out = wide_console()
    plans = [ReadingPlan(f"/docs/{name.replace('/', '_')}", "text", 1, 10, 5, True, "snapkv", None) for name in NAMES]
    console.print(inspect_table(plans, "models/[big].gguf", 4096))
    text = out.getvalue()
    assert "model models/[big].gguf" in text
    for name in NAMES:
        assert f"│ {name.replace('/', '_')} " in text  # a file name has no '/'; '[b]x[_b]' is markup just as well


# ---- the chat app ----------------------------------------------------------------------------------


async def test_the_picker_lists_names_as_typed_and_opens_them(tmp_path: Path) -> None:
    folder = tmp_path / "[red]folder"
    folder.mkdir()
    for name in NAMES:
        (folder / name.replace("/", "_")).write_bytes(b"x")  # '/' cannot be in a file name
    sessions = FakeSessions()
    app = KvchatApp(sessions, [], start_dir=folder)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        assert str(folder) in app.screen.query_one(Label).visual.plain
        tree = app.screen.query_one(DocumentTree)
        await tree.reload()
        listed = sorted(child.label.plain for child in tree.root.children)
        assert listed == sorted(name.replace("/", "_") for name in NAMES)
        tree.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.session is not None)
        assert app.sub_title == sorted(NAMES)[0].replace("/", "_")


async def test_the_kept_view_names_the_documents_as_typed() -> None:
    names = NAMES[1], NAMES[2]  # file names: a bundle names each document by its path's last part
    app = KvchatApp(FakeSessions(), [Path(name) for name in names])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await ask(pilot, app, "Boat?")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        shown = app.screen.query_one(Label).visual.plain
        assert shown.startswith("Kept  ") and f"· {names[0]}: " in shown and f"· {names[1]}: " in shown


@pytest.mark.parametrize("typed", ["[/]", "[red]9", "[b"])
async def test_a_settings_error_shows_the_value_as_typed(typed: str) -> None:
    app = KvchatApp(FakeSessions(), [Path("notes.txt")])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#budget", Input).value = typed
        error = app.screen.query_one("#settings-error", Label)
        await pilot.click("#save")
        await wait_for(pilot, lambda: error.visual.plain)
        assert error.visual.plain == (f"KV budget should be a valid integer, unable to parse string as an integer, not {typed!r} "
                                      "(hint: 1024 is the default)")
