"""The answering route: everything between a question about a document and its answer with its
sources, decided here for every front end (`kvchat ask`, `chat`, `serve` and `bench`, through the
Engine's ask, answer and prepare).

1. The question's wording is classified once (whole_question.answers_in_parts): a question about
   the whole document is answered in parts, each on a context of its own (in_parts.py); any
   other from the entries it keeps of the conversation's reading (from_kept.py).
2. A conversation not opened yet is opened for the question: where another process reads the
   document whole and awaiting that reading answers sooner, it is awaited and loaded
   (_sooner_to_wait); otherwise it is read, loaded, or left to the question to read fast
   (Conversation.open, then Conversation.select).
3. The answer's Done names its sources (unless they are off) and says whether the document is to
   be read now, in the background, for the questions after it (Done.read_later);
   the front end starts that reading its own way.

answer() decodes the answer on the conversation's context; prepare() stops before the decoding,
for the server, which decodes in its shared batch (elsewhere.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterator
from dataclasses import replace

from kvchat.engine.answering.elsewhere import PreparedPrompt, kept_prompt
from kvchat.engine.answering.from_kept import answer_from_kept
from kvchat.engine.answering.in_parts import ConversationFor, answer_in_parts
from kvchat.engine.answering.whole_question import answers_in_parts
from kvchat.engine.conversation import Conversation
from kvchat.engine.kvcache.foreground import Foreground
from kvchat.engine.kvcache.in_progress import InProgress
from kvchat.engine.prompt import Turn
from kvchat.engine.reading.cheap_pass import fast_is_sooner, fast_reading_s
from kvchat.engine.settings import AskSettings
from kvchat.events import Done, Event, LaterReading, Notice
from kvchat.errors import raise_if_cancelled
from kvchat.llama import Sampler


def answer(
    conversation: Conversation, question: str, settings: AskSettings | None = None, *,
    cancel: threading.Event | None = None, parts: ConversationFor | None = None, foreground: Foreground | None = None,
) -> Iterator[Event]:
    """`question`'s answer on `conversation`, in the light of its turns; the turn is recorded when
    done. `settings` override the conversation's for this answer (the chat's settings change, the
    bench's variants). `parts` makes the conversations a question about the whole document is
    answered on (None: every question is answered from kept entries); `foreground` is held while
    the question is read and answered, so that background readings pause meanwhile."""
    settings = conversation.settings_for(settings)
    in_parts = parts is not None and answers_in_parts(settings.in_parts, question)
    if not conversation.opened:
        if in_parts:
            conversation.skip_reading()  # the parts are read on their own; a follow-up reads fast or whole (select())
        else:
            yield from _await_if_sooner(conversation, cancel)
    with foreground.answering() if foreground is not None else contextlib.nullcontext():
        if not conversation.opened:
            yield from conversation.open(question, cancel=cancel)
        if in_parts:
            assert parts is not None
            done = yield from _answer_in_parts(conversation, parts, question, settings, cancel)
        else:
            done = yield from _all_but_done(answer_from_kept(conversation, question, settings, cancel))
    conversation.turns.append(Turn(question, done.answer))
    yield replace(done, read_later=_read_later(conversation))


def prepare(
    conversation: Conversation, question: str, settings: AskSettings, sampler: Sampler, cancel: threading.Event, *,
    parts: ConversationFor | None = None,
) -> Generator[Event, None, Done | PreparedPrompt]:
    """As answer(), to the first token of the answer (drawn by `sampler`), for an answer decoded
    elsewhere (the server's shared batch): returns the PreparedPrompt, or the Done of a question
    answered in parts (all its other events yielded). The conversation is opened without the
    question (it observes no streamed reading), as the server has always read."""
    settings = conversation.settings_for(settings)
    if parts is not None and answers_in_parts(settings.in_parts, question):
        conversation.skip_reading()
        done = yield from _answer_in_parts(conversation, parts, question, settings, cancel)
        return replace(done, read_later=_read_later(conversation))
    conversation.check_question(question, settings)  # before the document is read for it
    yield from conversation.open(cancel=cancel)
    selected = yield from conversation.select(question, cancel, settings)
    finder = conversation.source_finder if settings.sources else None
    return kept_prompt(conversation.run, selected, sampler, settings, finder, _read_later(conversation))


def _answer_in_parts(
    conversation: Conversation, parts: ConversationFor, question: str, settings: AskSettings, cancel: threading.Event | None,
) -> Generator[Event, None, Done]:
    """The events of `question`'s answer from each part of the conversation's document in turn
    (in_parts.py), but its Done, which is returned."""
    events = answer_in_parts(parts, conversation.document, question, settings, conversation.model.count_tokens, cancel)
    return (yield from _all_but_done(events))


def _all_but_done(events: Iterator[Event]) -> Generator[Event, None, Done]:
    """The events of an answer but its Done, which is returned."""
    done = None
    for event in events:
        if isinstance(event, Done):
            done = event
        else:
            yield event
    assert done is not None  # an answer ends with its Done
    return done


def _read_later(conversation: Conversation) -> LaterReading | None:
    """Whether the document is to be read (whole, or as its passages) and saved after this answer:
    it was not (a fast reading, or the parts answered), it can be saved, and no process reads it already."""
    key = conversation.later_key  # None: nothing is saved (no store, or read streamed)
    if key is None or not conversation.unread or conversation.later_saved:
        return None
    if conversation.in_progress is not None and conversation.in_progress.find(key) is not None:
        return None
    return conversation.reading.later


def _await_if_sooner(conversation: Conversation, cancel: threading.Event | None) -> Iterator[Event]:
    """While another process reads the document whole (a background reading), its progress,
    until it is saved, when awaiting it is sooner than reading here; open() then loads it."""
    key, in_progress = conversation.reading_key, conversation.in_progress
    if key is None or in_progress is None or conversation.saved:
        return
    reading = in_progress.find(key)
    if reading is None or not _sooner_to_wait(conversation, reading):
        return
    left_s = _left_s(conversation, reading)
    left = f", about {left_s:.0f} s left" if left_s is not None else ""
    yield Notice(f"waiting for the whole reading of this document in another kvchat process{left}")
    with in_progress.foreground.stepping_aside():  # `kvchat ask` holds it from its start: that reading must not pause
        yield from in_progress.progress_of(key, cancel)
    raise_if_cancelled(cancel)


def _sooner_to_wait(conversation: Conversation, reading: InProgress) -> bool:
    """Whether awaiting another process's whole reading of the document answers sooner than this
    question's own reading: always instead of a whole reading (the other has a head start);
    instead of a fast one when less of the other is left than the fast reading takes here, unless
    every question reads fast. A reading that waits for its turn behind others has no head start: never."""
    if reading.queued:
        return False
    if not conversation.reads_fast_first():
        return True
    if conversation.reading.later is not LaterReading.WHOLE:
        return False  # every question reads fast (retrieval, a passage bank): the other's reading would not be loaded
    fast_s = fast_reading_s(len(conversation.document_tokens), conversation.settings, conversation.speeds)
    return not fast_is_sooner(fast_s, _left_s(conversation, reading))


def _left_s(conversation: Conversation, reading: InProgress) -> float | None:
    """The other process's time left: at its own speed, or before it has read a batch at this
    machine's last whole-reading speed (it may have loaded most of the document already)."""
    if reading.left_s is not None or conversation.speeds is None:
        return reading.left_s
    speed = conversation.speeds.tokens_per_s(conversation.reading.speed)
    return (reading.total - reading.done) / speed if speed else None
