"""After an answer from a fast reading, the chat app reads the whole document in the background,
so that the follow-ups are selected from it (Conversation.read_on), as after a full reading.

It runs in a worker of its own while the user reads the answer. A question, a new document, Esc
or quitting stops it first (`stop_reading_on`, on the UI thread); a worker that uses the model
next waits for `reading_on_idle`. A question is answered from a fast reading of its own, or goes
on with the reading from where it stopped where the rest is sooner (Conversation.select); after
its answer the reading starts again from there.
The side panel shows how far it got.
"""

from __future__ import annotations

import threading

from textual import work
from textual.app import App

from kvchat.events import Event, Notice, Progress
from kvchat.tui.messages import EngineEvent, JobEnded
from kvchat.tui.sessions import ChatSession
from kvchat.tui.widgets import KvPanel, NoticeView


class BackgroundReading(App[None]):
    """The background reading of the chat app (a base class of KvchatApp)."""

    def __init__(self) -> None:
        super().__init__()
        self.reading_on_idle = threading.Event()  # set while no reading goes on in the background
        self.reading_on_idle.set()
        self._reading_on_cancel = threading.Event()

    def start_reading_on(self, session: ChatSession) -> None:
        self.reading_on_idle.clear()
        self._reading_on_cancel = threading.Event()
        self._show_reading_on("starting")
        self._read_on(session, self._reading_on_cancel)

    def stop_reading_on(self, taken_over: bool = False) -> None:
        """Stop the background reading, if one runs; `taken_over`: for a question (which reads
        fast, or goes on with it under its own reading bar)."""
        self._reading_on_cancel.set()
        if taken_over and not self.reading_on_idle.is_set():
            self._show_reading_on(None)  # the answer's own reading bar shows the rest

    @work(thread=True, group="reading-on", exit_on_error=False)
    def _read_on(self, session: ChatSession, cancel: threading.Event) -> None:
        try:
            for event in session.read_on(cancel):
                self.post_message(EngineEvent(event, background=True))
            ended = JobEnded("reading on", "done")
        except BaseException as error:
            ended = JobEnded.of_error("reading on", error)
        self.reading_on_idle.set()
        self.post_message(ended)

    async def reading_on_event(self, event: Event) -> None:
        if isinstance(event, Progress):
            self._show_reading_on(f"{event.done:,}/{event.total:,}")
        elif isinstance(event, Notice):
            await self.query_one("#transcript").mount(NoticeView(event.text, markup=False))

    def reading_on_ended(self, message: JobEnded) -> None:
        if self.query_one(KvPanel).figures.full_reading is not None:  # else a question took it over
            self._show_reading_on({"done": "done", "cancelled": "stopped"}.get(message.outcome, "failed"))
        if message.outcome == "error":
            self.notify(message.error, title="kvchat", severity="error", timeout=12, markup=False)

    def _show_reading_on(self, state: str | None) -> None:
        panel = self.query_one(KvPanel)
        panel.figures.full_reading = state
        panel.refresh_figures()
