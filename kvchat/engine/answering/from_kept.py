"""An answer from the entries a question keeps of the conversation's reading: the prompt
selected (Conversation.select), the answer decoded on the conversation's context, then its
sources (text/sources.py) from the attention the answer's tokens paid (attention.py) to the kept cells.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from dataclasses import replace

from kvchat.engine.answering.attention import Attention, answer_attention
from kvchat.engine.text.sources import SourceFinder
from kvchat.engine.conversation import Conversation
from kvchat.engine.settings import AskSettings
from kvchat.errors import KvchatError
from kvchat.events import Done, Event, Notice, Source

LOGGER = logging.getLogger(__name__)


def answer_from_kept(
    conversation: Conversation, question: str, settings: AskSettings, cancel: threading.Event | None
) -> Generator[Event, None, Done]:
    """The events of `question`'s answer from what it keeps of `conversation`'s reading (the
    reading done first where open() left it to the question), its Done with its sources unless
    `settings` turn them off; returns that Done."""
    selected = yield from conversation.select(question, cancel, settings)
    def attention() -> Attention | None:
        return answer_attention(conversation.run.cache, selected.kept)

    done = None
    for event in conversation.decode(selected, settings, cancel):
        if isinstance(event, Done):
            event = done = yield from _with_sources(event, attention, conversation.source_finder, settings)
        yield event
    assert done is not None  # an answer ends with its Done
    return done


def _with_sources(
    done: Done, attention: Callable[[], Attention | None], finder: SourceFinder, settings: AskSettings
) -> Generator[Event, None, Done]:
    """`done` with the passages the answer drew on, unless sources are off or it was stopped. If
    finding them fails, a Notice says so and the answer stands without."""
    if not settings.sources or done.stats.stop_reason == "cancelled":
        return done
    sources, strip, notice = sources_or_notice(finder, attention)
    if notice is not None:
        yield notice
    return replace(done, sources=sources, attention=strip) if sources or strip else done


def sources_or_notice(
    finder: SourceFinder, attention: Callable[[], Attention | None],
) -> tuple[tuple[Source, ...], tuple[float, ...], Notice | None]:
    """The sources the answer's `attention` names and its share along the text (Done's sources and
    attention), for an answer decoded here and one decoded in the server's shared batch alike. The
    one policy where finding them fails: the answer stands without them, the failure is logged,
    and a Notice tells the user (none where the answer attended to no cell: nothing failed)."""
    try:
        found = attention()
        if found is None:
            return (), (), None
        return finder.sources(*found), finder.strip(*found), None
    except Exception as error:  # a sources' failure never loses the answer, nor takes a server's model thread down
        LOGGER.exception("finding the answer's sources failed")
        message = error.message if isinstance(error, KvchatError) else str(error) or type(error).__name__
        return (), (), Notice(f"no sources for this answer: {message}")
