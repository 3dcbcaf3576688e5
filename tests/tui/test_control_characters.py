"""The chat paints no control character of an answer or a document but newline and tab: a quoted
`ESC]0;pwned BEL` set the terminal's title, and the tiny model's noise at temperature 2 (0x14,
0x18) reached the screen as it came. Each is painted as its visible stand-in (errors.printable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.widget import Widget
from textual.widgets import Static

from tests.fake_sessions import DOCUMENT_TEXT, FakeSessions
from kvchat.events import Source
from kvchat.tui.app import KvchatApp
from kvchat.tui.screens import KeptScreen
from kvchat.tui.widgets import AnswerView, SourceList
from tests.tui.test_tui import SIZE, ask, wait_for

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control character but tab and newline
# a sequence split across the answer's tokens, as a model streams it
ANSWER = ["The title is \x1b]0;pw", "ned\x07, then \x1b", "[31mred\x14\x18\x9b"]
SHOWN = "The title is ␛]0;pwned␇, then ␛[31mred␔␘�"


def painted(widget: Widget) -> str:
    """The text `widget` and the widgets in it paint, line by line."""
    lines = [strip.text for part in (widget, *widget.query("*")) for strip in part.render_lines(part.region.reset_offset)]
    return "\n".join(line.rstrip() for line in lines if line.strip())


async def test_an_answer_and_its_sources_are_painted_with_stand_ins_for_control_characters() -> None:
    source = Source(0, 12, "Field\x1b[2J notes.", 1.0, "line 1")
    app = KvchatApp(FakeSessions(answer=ANSWER, sources=(source,)), [Path("notes.txt")])
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "Quote the title exactly.")
        await wait_for(pilot, lambda: app.query(SourceList))
        answer, sources = painted(app.query(AnswerView).last()), painted(app.query_one(SourceList))
    assert SHOWN in answer and '"Field␛[2J notes."' in sources
    assert not CONTROL.search(answer + sources)


async def test_the_document_view_paints_stand_ins_where_the_kept_spans_still_point(monkeypatch: pytest.MonkeyPatch) -> None:
    text = DOCUMENT_TEXT.replace("Grey", "\x1b[2J").replace("four", "\x07\x07\r\x18")  # as long as before
    monkeypatch.setattr("tests.fake_sessions.DOCUMENT_TEXT", text)
    app = KvchatApp(FakeSessions(), [Path("notes.txt")])
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "Boat?")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        body = app.screen.query_one("#kept-text", Static)
        shown, content = painted(body), body.visual
        highlighted = [content.plain[span.start:span.end] for span in content.spans if "yellow" in str(span.style)]
    assert "the ␛[2J Heron." in shown and "on day ␇␇␍␘." in shown and not CONTROL.search(shown)
    assert highlighted == ["The boat was named the ␛[2J Heron."]  # the kept span (13, 47), as before
