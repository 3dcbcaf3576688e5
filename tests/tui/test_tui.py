"""The chat app driven with Textual's Pilot on a fake engine (tests/fake_sessions.py)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from textual.message import Message
from textual.widgets import Input, Label, Select

from tests.fake_sessions import PRUNED_PER_HEAD, SOURCES, FakeSessions
from kvchat.engine import AskSettings
from kvchat.engine.kvcache.foreground import Foreground
from kvchat.errors import DocumentError, ModelError
from kvchat.tui.app import KvchatApp
from kvchat.tui.messages import JobEnded
from kvchat.tui.screens import DocumentTree, HelpScreen, KeptScreen, PickerScreen, SettingsScreen
from kvchat.tui.widgets import AnswerView, KvPanel, QuestionView, ReadingBar, SourceList

DOCUMENT = Path("notes.txt")
SIZE = (120, 40)


async def wait_for(pilot, condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Let the app run until `condition()` holds: checked now, then each time the app or its
    current screen has handled a message (Textual publishes it on `message_signal` once its
    handlers ran; the workers' events, their ends and the keys are such messages) and each time
    the screen changes. Nothing is polled."""
    app = pilot.app
    reached = asyncio.Event()

    def check(_what: object = None) -> None:
        if not reached.is_set() and condition():
            reached.set()

    for signal in (app.message_signal, app.screen_change_signal, app.screen.message_signal):
        signal.subscribe(app, check, immediate=True)  # left subscribed: once reached it does nothing
    check()
    try:
        await asyncio.wait_for(reached.wait(), timeout_s)
    except TimeoutError:
        raise AssertionError("the app did not get there in time") from None


def notifications(app: KvchatApp) -> list[str]:
    return [notification.message for notification in app._notifications]


async def submit(pilot, app: KvchatApp, question: str) -> None:
    """Type `question` and press enter, once the document is open."""
    await wait_for(pilot, lambda: app.session is not None)
    app.query_one("#question", Input).value = question
    await pilot.press("enter")


def next_handled(app: KvchatApp, accept: Callable[[Message], bool]) -> asyncio.Future[Message]:
    """The next message the app handles that `accept`s, once its handlers ran; listened for from
    now on (before the action that leads to it)."""
    handled: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def check(message: Message) -> None:
        if not handled.done() and accept(message):
            handled.set_result(message)

    app.message_signal.subscribe(app, check, immediate=True)  # left subscribed, as in wait_for
    return handled


async def ask(pilot, app: KvchatApp, question: str, timeout_s: float = 10.0) -> None:
    """Submit `question` once the document is open; wait until the app has shown the whole answer."""
    await wait_for(pilot, lambda: app.session is not None, timeout_s)
    answered = next_handled(app, lambda message: isinstance(message, JobEnded) and message.job == "answering")
    await submit(pilot, app, question)
    ended = await asyncio.wait_for(answered, timeout_s)
    assert ended.outcome == "done", ended.error


async def test_a_question_gets_a_streamed_answer_and_the_panel_its_figures() -> None:
    sessions = FakeSessions()
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await ask(pilot, app, "What was the boat called?")
        assert [q.visual.plain for q in app.query(QuestionView)] == ["› What was the boat called?"]
        assert app.query_one(AnswerView).source == "The boat was named the **Grey Heron**."
        assert sessions.opened[0].asked[0][0] == "What was the boat called?"
        figures = app.query_one(KvPanel).figures
        assert (figures.cells, figures.prompt_tokens, figures.ttft_s) == (256, 2000, 0.5)
        assert figures.document_tokens == 2000 and figures.pages == 1
        assert app.query_one("#question", Input).value == ""


async def test_the_panel_says_when_a_prompt_was_read_fast() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT], AskSettings(read="fast"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await ask(pilot, app, "What was the boat called?")
        panel = app.query_one(KvPanel)
        assert panel.figures.read == "fast 12/24 layers"
        shown = Console(record=True, width=60, file=io.StringIO())
        shown.print(panel.content)
        assert "read fast 12/24 layers" in [" ".join(line.split()) for line in shown.export_text().splitlines()]


def reading_on_ended(app: KvchatApp) -> asyncio.Future[Message]:
    return next_handled(app, lambda message: isinstance(message, JobEnded) and message.job == "reading on")


async def test_after_a_fast_answer_the_document_is_read_whole_in_the_background_for_the_follow_ups() -> None:
    sessions = FakeSessions(paced_reading_on=True)
    app = KvchatApp(sessions, [DOCUMENT], AskSettings(read="fast"))
    async with app.run_test(size=SIZE) as pilot:
        ended = reading_on_ended(app)
        await ask(pilot, app, "What was the boat called?")
        session, panel = sessions.opened[0], app.query_one(KvPanel)
        assert session.unread and not app.reading_on_idle.is_set() and app.busy is None
        session.allow(2)
        await wait_for(pilot, lambda: panel.figures.later_reading == "1,000/2,000")
        session.allow(2)
        assert (await asyncio.wait_for(ended, 10)).outcome == "done"
        assert panel.figures.later_reading == "done" and not session.unread
        await ask(pilot, app, "What failed?")
        assert [reader for reader, _ in session.chunks_read_on] == ["background"] * 4  # the follow-up read nothing


@pytest.mark.parametrize("follow_ups_read_fast", [False, True])
async def test_a_question_pauses_the_background_reading_and_it_goes_on_from_where_it_stopped(follow_ups_read_fast: bool) -> None:
    """The question goes on with the reading itself where the rest is sooner (the reading is then
    done), or reads fast, and the background reading goes on after its answer."""
    sessions = FakeSessions(paced_reading_on=True, follow_ups_read_fast=follow_ups_read_fast)
    app = KvchatApp(sessions, [DOCUMENT], AskSettings(read="fast"))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "What was the boat called?")
        session, panel = sessions.opened[0], app.query_one(KvPanel)
        session.allow()
        await wait_for(pilot, lambda: panel.figures.later_reading == "500/2,000")
        ended = reading_on_ended(app)
        answered = next_handled(app, lambda message: isinstance(message, JobEnded) and message.job == "answering")
        await submit(pilot, app, "What failed?")
        await wait_for(pilot, lambda: app.busy == "answering")
        assert panel.figures.later_reading == "paused at 500/2,000"
        session.allow()  # the background reading's next chunk sees the stop
        assert (await asyncio.wait_for(ended, 10)).outcome == "cancelled"
        assert panel.figures.later_reading == "paused at 500/2,000"  # not "stopped"
        assert (await asyncio.wait_for(answered, 10)).outcome == "done"
        assert not app.query_one(ReadingBar).display and app.query_one("#question", Input).border_subtitle == ""
        if not follow_ups_read_fast:
            assert session.chunks_read_on == [("background", 0), ("What failed?", 500), ("What failed?", 1000), ("What failed?", 1500)]
            assert panel.figures.later_reading == "done"  # the question read the rest
            return
        assert panel.figures.later_reading == "going on from 500/2,000" and session.unread
        ended = reading_on_ended(app)
        session.allow()
        await wait_for(pilot, lambda: panel.figures.later_reading == "1,000/2,000")
        assert session.chunks_read_on == [("background", 0), ("background", 500)]  # the follow-up read none of it
        session.allow(2)
        assert (await asyncio.wait_for(ended, 10)).outcome == "done" and panel.figures.later_reading == "done"


async def test_the_background_reading_waits_while_another_kvchat_process_answers_a_question(tmp_path: Path) -> None:
    elsewhere = Foreground(tmp_path)  # another process's question holds it as `kvchat ask` does
    sessions = FakeSessions(paced_reading_on=True, foreground=Foreground(tmp_path))
    app = KvchatApp(sessions, [DOCUMENT], AskSettings(read="fast"))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "What was the boat called?")
        session, panel = sessions.opened[0], app.query_one(KvPanel)
        with elsewhere.answering():
            session.allow(4)  # allowed, yet after its first chunk the reading waits for the question
            await wait_for(pilot, lambda: panel.figures.later_reading == "paused at 500/2,000: a question elsewhere")
            assert session.chunks_read_on == [("background", 0)]
            ended = reading_on_ended(app)
        assert (await asyncio.wait_for(ended, 10)).outcome == "done"
        assert panel.figures.later_reading == "done" and len(session.chunks_read_on) == 4


async def test_quitting_stops_the_background_reading_and_closes_the_engine() -> None:
    sessions = FakeSessions(paced_reading_on=True)
    app = KvchatApp(sessions, [DOCUMENT], AskSettings(read="fast"))
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "What was the boat called?")
        session = sessions.opened[0]
        session.allow()
        await wait_for(pilot, lambda: len(session.chunks_read_on) == 1)
        await pilot.press("ctrl+q")
        session.allow()
    await asyncio.to_thread(app.close_engine, 10.0)
    assert app.reading_on_idle.is_set() and sessions.closed and session.closed and session.chunks_read_on == [("background", 0)]


async def test_a_startup_warning_is_shown_once_the_app_is_up() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT], startup_warning="--gpu-layers 99 has no effect [cpu]")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        assert notifications(app) == ["--gpu-layers 99 has no effect [cpu]"]


async def test_brackets_in_questions_and_errors_are_shown_as_typed() -> None:
    sessions = FakeSessions()
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "What does [/] or [b]this[/b] mean?")
        assert app.query_one(QuestionView).visual.plain == "› What does [/] or [b]this[/b] mean?"
    failing = KvchatApp(FakeSessions(error=DocumentError("[draft] notes.txt: empty", "add [text]")), [DOCUMENT])
    async with failing.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: failing.busy is None and notifications(failing))
        assert notifications(failing) == ["[draft] notes.txt: empty (hint: add [text])"]


async def test_escape_stops_an_answer_midway() -> None:
    sessions = FakeSessions(paced_answer=True, answer=[f"word{i} " for i in range(200)])
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, app, "Tell me everything.")
        session = sessions.opened[0]
        session.allow(3)
        await wait_for(pilot, lambda: session.tokens_sent == 3)
        assert app.query_one("#question", Input).border_subtitle == "answering… esc stops"
        await pilot.press("escape")
        session.allow()  # the token being made ends, and the answer with it
        await wait_for(pilot, lambda: app.busy is None and app._answer is None)
        assert app.query_one(AnswerView).source == "word0 word1 word2 \n\n*(stopped)*"
        assert session.tokens_sent == 3
        assert app.query_one("#question", Input).border_subtitle == ""


async def test_escape_stops_the_reading_and_closes_the_half_read_session() -> None:
    sessions = FakeSessions(paced_reading=True)
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: sessions.opened)
        session = sessions.opened[0]
        session.allow()
        await wait_for(pilot, lambda: session.chunks_read == 1)
        assert app.query_one("ReadingBar").display
        assert app.query_one("#question", Input).border_subtitle == "reading… esc stops"
        await pilot.press("escape")
        session.allow()  # the chunk being read ends, and the reading with it
        await wait_for(pilot, lambda: app.busy is None)
        assert app.session is None and session.closed and session.chunks_read == 1
        assert not app.query_one("ReadingBar").display


async def test_settings_refuse_a_budget_smaller_than_the_window() -> None:
    sessions = FakeSessions()
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#budget", Input).value = "20"
        error = app.screen.query_one("#settings-error", Label)
        await pilot.click("#save")
        await wait_for(pilot, lambda: error.visual.plain)
        assert isinstance(app.screen, SettingsScreen)
        assert "budget 20 is smaller than window 32" in error.visual.plain
        app.screen.query_one("#budget", Input).value = "256"
        app.screen.query_one("#in-parts", Select).value = "off"
        kernel = app.screen.query_one("#kernel", Input)
        kernel.value = "5"
        kernel.focus()
        await pilot.press("enter")  # enter in a field saves, like the button
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert (app.settings.method.budget, app.settings.method.kernel, app.settings.in_parts) == (256, 5, "off")
        await ask(pilot, app, "Again?")
        assert (sessions.opened[0].asked[0][1].method.budget, sessions.opened[0].asked[0][1].in_parts) == (256, "off")


async def test_settings_refuse_an_even_kernel_and_text_in_a_number() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#kernel", Input).value = "4"
        error = app.screen.query_one("#settings-error", Label)
        await pilot.click("#save")
        await wait_for(pilot, lambda: error.visual.plain)
        assert isinstance(app.screen, SettingsScreen) and "kernel" in error.visual.plain
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings.method.kernel == 7


@pytest.mark.parametrize(
    "error",
    [
        DocumentError("notes.txt: the PDF is encrypted", "save an unencrypted copy first"),
        ModelError("model 'default' is not installed", "pip install -e '.[model]'"),
    ],
)
async def test_errors_become_notifications_with_their_hint(error) -> None:
    app = KvchatApp(FakeSessions(error=error), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.busy is None and notifications(app))
        assert notifications(app) == [error.one_line()]
        assert app.session is None and app.is_running
        app.query_one("#question", Input).value = "Anything?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(notifications(app)) == 2)
        assert "no document is open" in notifications(app)[-1]


async def test_new_conversation_resets_the_session_and_clears_the_transcript() -> None:
    sessions = FakeSessions()
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await ask(pilot, app, "First?")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: sessions.opened[0].resets == 1)
        assert not app.query(QuestionView) and not app.query(AnswerView)


async def test_kept_view_highlights_what_the_selection_kept() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.press("ctrl+t")
        assert "nothing pruned yet" in notifications(app)[-1]
        await ask(pilot, app, "Boat?")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        text = app.screen.query_one("#kept-text").visual
        highlighted = [text.plain[span.start : span.end] for span in text.spans if "yellow" in str(span.style)]
        assert highlighted == ["The boat was named the Grey Heron."]
        assert "256 of 2,000 prompt tokens kept" in app.screen.summary


async def test_kept_view_of_a_selection_per_head_tells_every_head_from_some() -> None:
    app = KvchatApp(FakeSessions(pruned=PRUNED_PER_HEAD), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "Boat?")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        text = app.screen.query_one("#kept-text").visual
        styled = {text.plain[span.start : span.end]: str(span.style) for span in text.spans}
        assert styled["Field notes."].endswith("on ansi_yellow bold") and styled["The radio failed on day four."] == styled["Field notes."]
        assert "yellow" in styled["The boat was named the Grey Heron."] and " on " not in styled["The boat was named the Grey Heron."]
        assert "kept by each of 4 layer and KV heads" in app.screen.summary
        assert "every head (2 tokens)" in app.screen.summary and "some of them (1)" in app.screen.summary


async def test_an_answer_lists_its_sources_and_one_opens_the_document_there() -> None:
    app = KvchatApp(FakeSessions(sources=SOURCES), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, app, "Radio?")
        await wait_for(pilot, lambda: app.query(SourceList))
        listed = app.query_one(SourceList)
        assert [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)] == [
            'line 1 · "The radio failed on day four."', 'line 1 · "Field notes."']
        listed.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        text = app.screen.query_one("#kept-text").visual
        marked = [text.plain[span.start : span.end] for span in text.spans if "green" in str(span.style)]
        assert marked == ["The radio failed on day four."]
        await pilot.press("escape")
        listed.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen) and app.screen.focus == (0, 12))


async def test_help_opens_with_f1_and_question_mark_types_into_the_box() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.press("question_mark")
        assert app.query_one("#question", Input).value == "?"
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_one_dialog_at_a_time_and_its_key_closes_it() -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.press("f1", "f1", "f1")  # open, close, open: never two help screens
        await pilot.pause()
        assert [type(screen) for screen in app.screen_stack[1:]] == [HelpScreen]
        await pilot.press("ctrl+s", "ctrl+t", "ctrl+o")  # other dialogs' keys do nothing meanwhile
        await pilot.pause()
        assert [type(screen) for screen in app.screen_stack[1:]] == [HelpScreen]
        await pilot.press("f1")
        await wait_for(pilot, lambda: len(app.screen_stack) == 1)
        await pilot.press("ctrl+s", "ctrl+s", "ctrl+s")
        await pilot.pause()
        assert [type(screen) for screen in app.screen_stack[1:]] == [SettingsScreen]


@pytest.mark.parametrize("size", [(40, 10), (79, 24), (80, 24)])
async def test_the_question_box_stays_usable_on_small_terminals(size: tuple[int, int]) -> None:
    app = KvchatApp(FakeSessions(), [DOCUMENT])
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.pause()
        box, panel = app.query_one("#question", Input).region, app.query_one(KvPanel).region
        assert box.width >= 38 and box.bottom <= size[1] - 1  # above the footer, at least 36 columns to type in
        assert not box.overlaps(panel)
        assert panel.width == (34 if size[0] >= 80 else 0)  # the KV panel only where it fits beside the chat


async def test_picker_lists_documents_only_and_opens_the_chosen_one(tmp_path: Path) -> None:
    for name in ("report.pdf", "notes.txt", "image.png", ".hidden.txt"):
        (tmp_path / name).write_bytes(b"x")
    sessions = FakeSessions()
    app = KvchatApp(sessions, [], start_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        tree = app.screen.query_one(DocumentTree)
        await tree.reload()  # awaitable until the directory is listed
        assert sorted(child.label.plain for child in tree.root.children) == ["notes.txt", "report.pdf"]
        tree.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.session is not None)
        assert sessions.opened[0].document.path.parent == tmp_path


async def test_quitting_while_answering_stops_the_worker_and_closes_the_engine() -> None:
    sessions = FakeSessions(paced_answer=True, answer=[f"w{i} " for i in range(400)])
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, app, "Long answer please")
        session = sessions.opened[0]
        session.allow(2)
        await wait_for(pilot, lambda: session.tokens_sent == 2)
        await pilot.press("ctrl+q")
        session.allow()  # the token being made ends, and the answer with it
    await asyncio.to_thread(app.close_engine, 10.0)
    assert app.idle.is_set() and sessions.closed and session.closed and session.tokens_sent == 2


async def test_the_ocr_of_a_scanned_document_shows_its_pages_before_the_reading(monkeypatch) -> None:
    shown: list[tuple[str, str]] = []
    show_pages = ReadingBar.show_pages

    def recording(bar: ReadingBar, done: int, total: int) -> None:
        show_pages(bar, done, total)
        shown.append((str(bar.query_one("#reading-label", Label).render()), str(bar.query_one("#reading-speed", Label).render())))

    monkeypatch.setattr(ReadingBar, "show_pages", recording)
    app = KvchatApp(FakeSessions(scanned_pages=2), [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        assert shown == [("OCR", "0/2 pages"), ("OCR", "1/2 pages"), ("OCR", "2/2 pages")]


async def test_several_documents_are_read_together_and_another_one_is_added_with_ctrl_a(tmp_path: Path) -> None:
    (tmp_path / "ledger.txt").write_bytes(b"x")
    sessions = FakeSessions()
    app = KvchatApp(sessions, [Path("notes.txt"), Path("boat.txt")], start_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        assert app.sub_title == "notes.txt + boat.txt" and sessions.opened[0].document.kind == "bundle"
        await ask(pilot, app, "Boat?")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, KeptScreen))
        # the fake keeps text[13:47]; notes.txt starts after its 18-character heading line
        assert app.screen.summary.endswith("· notes.txt: 29 chars · boat.txt: 0 chars")
        await pilot.press("escape", "ctrl+a")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        tree = app.screen.query_one(DocumentTree)
        await tree.reload()
        tree.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: len(sessions.opened) == 2 and app.session is sessions.opened[1])
        assert [page.source for page in app.session.document.pages] == ["notes.txt", "boat.txt", "ledger.txt"]
        assert sessions.opened[0].closed and app.paths == [Path("notes.txt"), Path("boat.txt"), tmp_path / "ledger.txt"]


async def test_a_question_typed_while_the_document_is_read_is_kept_and_asked_when_it_is() -> None:
    sessions = FakeSessions(paced_reading=True)
    app = KvchatApp(sessions, [DOCUMENT])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: sessions.opened)
        await pilot.press(*"Who?")  # "?" is text here, not the help screen
        assert app.query_one("#question", Input).value == "Who?" and len(app.screen_stack) == 1
        answered = next_handled(app, lambda message: isinstance(message, JobEnded) and message.job == "answering")
        await pilot.press("enter")
        await pilot.pause()
        session = sessions.opened[0]
        assert app.busy == "reading" and session.asked == [] and app.query_one("#question", Input).value == ""
        session.allow(5)  # the reading's five chunks
        assert (await asyncio.wait_for(answered, 10)).outcome == "done"
        assert [question for question, _ in session.asked] == ["Who?"]
