"""From a new document's arrival, and after an answer from a fast reading, the chat app reads the
document for the follow-ups in the background (Conversation.read_on): as its passages, from which
they load what they choose, or whole, for them to be selected from it as after a full reading.

It runs in a worker of its own while the user reads the answer. A question, a new document, Esc
or quitting stops it first (`stop_reading_on`, on the UI thread); a worker that uses the model
next waits for `reading_on_idle`. A question is answered from a fast reading of its own, or goes
on with the reading from where it stopped where the rest is sooner (Conversation.select); after
its answer the reading starts again from there.
The side panel shows how far it got, "paused at" that while a question is answered (here, or in
another kvchat process: the reading stops part-way through its batch and waits for it), and
"done" when the question read the rest itself.
"""

from __future__ import annotations

import threading

from textual import work
from textual.app import App

from kvchat.events import Event, Notice, Progress
from kvchat.tui.messages import EngineEvent, JobEnded, PausedElsewhere
from kvchat.tui.sessions import ChatSession
from kvchat.tui.widgets import KvPanel, NoticeView


class BackgroundReader(App[None]):
    """The background reading of the chat app (a base class of KvchatApp)."""

    def __init__(self) -> None:
        super().__init__()
        self.reading_on_idle = threading.Event()  # set while no reading goes on in the background
        self.reading_on_idle.set()
        self._reading_on_cancel = threading.Event()
        self._reading_on_at = ""  # how far the reading got ("2,560/11,062"), shown while it is paused
        self._paused_for_question = False

    def start_reading_on(self, session: ChatSession, going_on: bool = False) -> None:
        """Read `session`'s document for the follow-ups in the background: from its start, or
        `going_on` from where a question paused it."""
        self.reading_on_idle.clear()
        self._reading_on_cancel = threading.Event()
        self._paused_for_question = False
        if not going_on:
            self._reading_on_at = ""  # a new document's: nothing read yet
        self._show_reading_on(f"going on from {self._reading_on_at}" if self._reading_on_at else "starting")
        self._read_on(session, self._reading_on_cancel)

    def stop_reading_on(self, taken_over: bool = False) -> None:
        """Stop the background reading, if one runs; `taken_over`: for a question (which reads
        fast, or goes on with it under its own reading bar)."""
        self._reading_on_cancel.set()
        if taken_over and not self.reading_on_idle.is_set():
            self._paused_for_question = True
            self._show_reading_on(f"paused at {self._reading_on_at}" if self._reading_on_at else "paused")

    def after_answer(self, session: ChatSession | None, answered: bool) -> None:
        """After a question's answer: the background reading goes on where the document is still
        unread (not after an answer that was stopped), and is done where the question read the rest."""
        if session is None:
            return
        if session.unread and answered:
            self.start_reading_on(session, going_on=True)
        elif not session.unread and self.query_one(KvPanel).figures.later_reading is not None:
            self._show_reading_on("done")

    @work(thread=True, group="reading-on", exit_on_error=False)
    def _read_on(self, session: ChatSession, cancel: threading.Event) -> None:
        try:
            for event in session.read_on(cancel, lambda waits: self.post_message(PausedElsewhere(waits))):
                self.post_message(EngineEvent(event, background=True))
            ended = JobEnded("reading on", "done")
        except BaseException as error:
            ended = JobEnded.of_error("reading on", error)
        self.reading_on_idle.set()
        self.post_message(ended)

    async def reading_on_event(self, event: Event) -> None:
        if isinstance(event, Progress):
            self._reading_on_at = f"{event.done:,}/{event.total:,}"
            self._show_reading_on(self._reading_on_at)
        elif isinstance(event, Notice):
            await self.query_one("#transcript").mount(NoticeView(event.text, markup=False))

    def reading_on_ended(self, message: JobEnded) -> None:
        if not self._paused_for_question and self.query_one(KvPanel).figures.later_reading is not None:
            self._show_reading_on({"done": "done", "cancelled": "stopped"}.get(message.outcome, "failed"))
        if message.outcome == "error":
            self.notify(message.error, title="kvchat", severity="error", timeout=12, markup=False)

    def on_paused_elsewhere(self, message: PausedElsewhere) -> None:
        """While another kvchat process answers a question, the reading waits for it (posted in
        order with the reading's events, so that `_reading_on_at` is where it waits)."""
        at = self._reading_on_at or "the start"
        self._show_reading_on(f"paused at {at}: a question elsewhere" if message.waits else at)

    def _show_reading_on(self, state: str | None) -> None:
        panel = self.query_one(KvPanel)
        panel.figures.later_reading = state
        panel.refresh_figures()
