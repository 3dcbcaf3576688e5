"""The chat app: a document (or several), a conversation about it, and the KV cache's figures beside it.

Model work runs in one thread worker at a time (reading or answering); it gets its own cancel
event, which Esc sets, and posts the engine's events back as messages. After an answer from a
fast reading, the document is read in the background as its follow-ups need it, its passages or
whole (background_reading.py). The app is built
around an injected SessionFactory, so tests drive it on a fake engine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Input, Markdown, OptionList
from textual.widgets.markdown import MarkdownStream

from kvchat.engine import AskSettings
from kvchat.errors import printable
from kvchat.events import Done, Notice, Progress, Pruned, Token
from kvchat.tui.dialogs import Dialogs
from kvchat.tui.messages import DocumentLoaded, EngineEvent, Job, JobEnded, PagesRead
from kvchat.tui.background_reading import BackgroundReader
from kvchat.tui.sessions import ChatSession, SessionFactory
from kvchat.tui.widgets import AnswerView, Exchange, KvPanel, NoticeView, ReadingBar, SourceList


class KvchatApp(Dialogs, BackgroundReader):
    CSS_PATH = "app.tcss"
    TITLE = "kvchat"
    # below 80 columns the side panel (34) would squeeze the question box: it is hidden there
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (80, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (16, "-tall")]
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_conversation", "New chat", priority=True),
        Binding("ctrl+o", "open_document", "Open", priority=True),
        Binding("ctrl+a", "add_document", "Add", priority=True),
        Binding("ctrl+s", "settings", "Settings", priority=True),
        Binding("ctrl+t", "kept", "Kept", priority=True),
        Binding("f1", "help", "Help", priority=True),
        Binding("question_mark", "help", "Help", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        sessions: SessionFactory,
        paths: Sequence[Path] = (),
        settings: AskSettings | None = None,
        start_dir: Path | None = None,
        startup_warning: str | None = None,
    ) -> None:
        super().__init__()
        self.startup_warning = startup_warning
        self.sessions = sessions
        self.settings = settings or AskSettings()
        self.paths = list(paths)  # the documents of the conversation, in the order they are named
        self.start_dir = start_dir or Path.cwd()
        self.session: ChatSession | None = None
        self.busy: Job | None = None
        self.idle = threading.Event()  # set while no worker touches the model
        self.idle.set()
        self._cancel = threading.Event()
        self._stream: MarkdownStream | None = None
        self._answer: AnswerView | None = None
        self._answer_text = ""
        self._stopped = False  # the last answer ended because Esc was pressed
        self._kept: Pruned | None = None  # what the last answer's selection kept
        self._waiting: str | None = None  # a question asked while its document was read: asked when it is

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield VerticalScroll(id="transcript")
                yield ReadingBar()
                yield Input(placeholder="Ask about the document…  (F1: keys)", id="question")
            yield KvPanel(self.settings)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#transcript").anchor()
        if self.startup_warning:
            self.notify(self.startup_warning, severity="warning", timeout=12, markup=False)
        if self.paths:
            self.open_paths(self.paths)
        else:
            self.action_open_document()

    # ---- jobs ---------------------------------------------------------------------------

    def _start(self, job: Job) -> threading.Event:
        self.busy = job
        self.query_one("#question", Input).border_subtitle = f"{job}… esc stops"
        self.idle.clear()
        self._cancel = threading.Event()
        return self._cancel

    def open_paths(self, paths: Sequence[Path]) -> None:
        """Close the open documents (if any) and read `paths`, asked about together."""
        old, self.session, self._kept = self.session, None, None
        self.paths = list(paths)
        self.sub_title = " + ".join(printable(path.name) for path in paths)
        self.stop_reading_on()
        self.query_one(ReadingBar).start("Reading")
        self._read(old, self.paths, self._start("reading"))
        self.query_one("#question", Input).focus()  # what is typed while it reads is the next question

    @work(thread=True, group="model", exit_on_error=False)
    def _read(self, old: ChatSession | None, paths: list[Path], cancel: threading.Event) -> None:
        session: ChatSession | None = None
        try:
            self.reading_on_idle.wait()  # open_paths() stopped it
            if old is not None:
                old.close()
            session = self.sessions.open(paths, self.settings, self._pages_read, cancel)
            self.post_message(DocumentLoaded(session.document))
            for event in session.read(cancel):
                self.post_message(EngineEvent(event))
            self._end(JobEnded("reading", "done", session=session))
        except BaseException as error:  # everything becomes a message: the app never dies of it
            if session is not None:
                session.close()
            self._end(JobEnded.of_error("reading", error))

    def _pages_read(self, done: int, total: int) -> None:
        """The OCR's progress, from the reading's thread."""
        self.post_message(PagesRead(done, total))

    @work(thread=True, group="model", exit_on_error=False)
    def _ask(self, session: ChatSession, question: str, settings: AskSettings, cancel: threading.Event) -> None:
        try:
            self.reading_on_idle.wait()  # ask_question() stopped it; the answer reads fast or on from there
            for event in session.ask(question, settings, cancel):
                self.post_message(EngineEvent(event))
            self._end(JobEnded("answering", "done"))
        except BaseException as error:
            self._end(JobEnded.of_error("answering", error))

    def _end(self, message: JobEnded) -> None:
        self.idle.set()
        self.post_message(message)

    # ---- messages from the workers -------------------------------------------------------

    def on_pages_read(self, message: PagesRead) -> None:
        self.query_one(ReadingBar).show_pages(message.done, message.total)

    def on_document_loaded(self, message: DocumentLoaded) -> None:
        self.query_one(ReadingBar).start("Reading")
        panel = self.query_one(KvPanel)
        document = message.document
        panel.figures = replace(panel.figures, document=printable(document.path.name), pages=len(document.pages) or None)
        panel.refresh_figures()

    async def on_engine_event(self, message: EngineEvent) -> None:
        event, panel = message.event, self.query_one(KvPanel)
        if message.background:
            await self.reading_on_event(event)
            return
        if isinstance(event, (Token, Pruned)) and self.busy == "answering":
            self.query_one(ReadingBar).stop()  # what the answer had to read is read
        if isinstance(event, Token):
            if self._stream is not None:
                shown = printable(event.text, lines=True)  # the model's control characters as ␛, ␇…
                self._answer_text += shown
                await self._stream.write(shown)
        elif isinstance(event, Progress) and self.busy is not None:
            bar = self.query_one(ReadingBar)
            if not bar.display:  # an answer's own reading: fast, or going on with the background one
                bar.start("Reading")
            bar.show(event)
            if self.busy == "reading":
                panel.figures.document_tokens = event.total
            if event.elapsed_s > 0:
                panel.figures.prefill_tps = event.tokens_per_s
            panel.refresh_figures()
        elif isinstance(event, Pruned):
            self._kept = event
            panel.figures.cells, panel.figures.prompt_tokens = event.kept_tokens, event.prompt_tokens
            panel.refresh_figures()
        elif isinstance(event, Notice):
            await self._transcript_line(event.text)
        elif isinstance(event, Done):
            panel.show_stats(event.stats)
            self._stopped = event.stats.stop_reason == "cancelled"
            if event.sources and self._answer is not None and self._answer.parent is not None and self.session is not None:
                await self._answer.parent.mount(SourceList(event.sources, self.session.document, self._kept))

    async def on_job_ended(self, message: JobEnded) -> None:
        if message.job == "reading on":
            self.reading_on_ended(message)
            return
        self.busy = None
        self.query_one("#question", Input).border_subtitle = ""
        self.query_one(ReadingBar).stop()
        if message.job == "reading":
            if message.outcome == "done":
                self.session = message.session  # type: ignore[assignment]
                panel = self.query_one(KvPanel)
                panel.figures.document_tokens = self.session.token_count  # type: ignore[union-attr]
                panel.refresh_figures()
                await self._transcript_line(f"Ready: ask about {self.sub_title}.")
                if self._waiting is not None:
                    await self._ask_now(self._waiting)
                elif self.session.unread:  # type: ignore[union-attr]
                    self.start_reading_on(self.session)  # type: ignore[arg-type]  # a question stops it, and reads fast
            elif message.outcome == "cancelled":
                await self._transcript_line("Reading stopped. ctrl+o opens a document.")
        else:
            stopped = message.outcome == "cancelled" or self._stopped
            await self._finish_answer("*(stopped)*" if stopped else "")
            self.after_answer(self.session, message.outcome == "done")  # type: ignore[arg-type]
        if message.outcome == "error":
            self.notify(message.error, title="kvchat", severity="error", timeout=12, markup=False)
        self._waiting = None  # asked, or its document was not read
        self.query_one("#question", Input).focus()

    async def _finish_answer(self, suffix: str) -> None:
        """Stop streaming and show the whole answer (stopping the stream drops what is pending)."""
        if self._stream is not None and self._answer is not None:
            await self._stream.stop()
            await self._answer.update(self._answer_text + (f"\n\n{suffix}" if suffix else ""))
        self._stream, self._answer, self._answer_text, self._stopped = None, None, "", False

    async def _transcript_line(self, text: str) -> None:
        await self.query_one("#transcript").mount(NoticeView(text, markup=False))

    # ---- the user's actions --------------------------------------------------------------

    @on(Input.Submitted, "#question")
    async def ask_question(self, message: Input.Submitted) -> None:
        question = message.value.strip()
        if not question:
            return
        if self.busy == "reading" and self._waiting is None:
            message.input.value = ""
            self._waiting = question
            await self._transcript_line(f"“{question}” is asked as soon as the document is read (esc stops the reading).")
            return
        if self.busy is not None:
            self.notify(f"still {self.busy}: esc stops it", severity="warning")
            return
        if self.session is None:
            self.notify("no document is open: ctrl+o opens one", severity="warning")
            return
        message.input.value = ""
        await self._ask_now(question)

    async def _ask_now(self, question: str) -> None:
        """Ask `question` about the open documents, its answer streamed into the transcript."""
        self.stop_reading_on(taken_over=True)
        exchange = Exchange(question)
        self._kept = None  # until this answer's selection prunes
        await self.query_one("#transcript").mount(exchange)
        self._answer = exchange.answer
        self._stream = Markdown.get_stream(self._answer)
        self._ask(self.session, question, self.settings, self._start("answering"))

    @on(OptionList.OptionSelected, "SourceList")
    def source_chosen(self, message: OptionList.OptionSelected) -> None:
        if isinstance(listed := message.option_list, SourceList):
            self.show_source(listed.sources[message.option_index], listed.document, listed.kept)

    def action_stop(self) -> None:
        if self.busy is not None:
            self._cancel.set()
        else:
            self.stop_reading_on()

    async def action_new_conversation(self) -> None:
        if self._dialog_open():
            return
        if self.busy is not None or self.session is None:
            self.notify("nothing to reset yet" if self.busy is None else "busy: esc stops it", severity="warning")
            return
        self.session.reset()
        await self.query_one("#transcript").remove_children()
        await self._transcript_line(f"New conversation about {self.sub_title}.")

    async def action_quit(self) -> None:
        self._cancel.set()
        self.stop_reading_on()
        self.exit()

    def close_engine(self, timeout_s: float = 120.0) -> None:
        """After the app has exited: stop model work, wait for it, free the model."""
        self._cancel.set()
        self.stop_reading_on()
        self.idle.wait(timeout_s)
        self.reading_on_idle.wait(timeout_s)
        if self.session is not None:
            self.session.close()
        self.sessions.close()
