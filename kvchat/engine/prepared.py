"""A prompt read and selected on a context of its own, to be answered on another: the server's
requests are prepared so, then moved into a sequence of its shared context (serving/slots.py).

What is prepared is a question about a document (its conversation resumed from the turns the
client sent back: the saved reading is loaded, the earlier turns pinned, the question observes),
or a chat of messages as the client sent it. A question about the whole document is answered
while it is prepared, each part on a context of its own (in_parts.py). The sources of an answer decoded elsewhere are found
from the prepared prompt's kept cells (answer_sources).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from kvchat.documents import Document
from kvchat.engine.kvcache.cache import KvCache, SavedCells
from kvchat.engine.conversation import Conversation
from kvchat.engine.engine import Engine
from kvchat.engine.in_parts import answer_in_parts
from kvchat.engine.prompt import Turn, chat_tokens
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.engine.reading.sizing import context_size, round_up
from kvchat.engine.answering.sources import SourceFinder
from kvchat.errors import SettingsError
from kvchat.events import Done, Event, Source
from kvchat.llama import LlamaContext, LlamaModel, Sampler

MIN_SAVED_READING = 256  # shorter new readings of a chat are not worth a state file


@dataclass
class PreparedPrompt:
    kept: SavedCells  # the kept cells, as a one-sequence state, and what they hold
    first_token: int  # the answer's first token, sampled from the logits of the whole prompt
    selected: Selected  # the prompt's length, the cells kept and loaded, the reading's and the selection's time
    settings: AskSettings  # those it was read with: the request's, or streamed for a long document
    finder: SourceFinder | None = None  # about a document, with sources on: what names an answer's sources
    unread: bool = False  # a fast reading answered: the document is still to be read whole (Conversation.read_on)


@dataclass(frozen=True)
class AnsweredInParts:
    """A question about the whole document, answered while it was prepared (in_parts.py)."""

    done: Done
    unread: bool  # the document itself is still to be read whole, for the questions after it


def prepare_question(
    engine: Engine, document: Document, turns: Sequence[Turn], question: str, settings: AskSettings,
    cancel: threading.Event, sampler: Sampler,
) -> Iterator[Event]:
    """Events while reading and pruning a question about `document` after `turns`; returns a
    PreparedPrompt whose first answer token `sampler` drew from the logits the observation
    window left (as in a single ask, the first token sees the whole prompt; the rest see what
    was kept), or for a question about the whole document, the answer's events (its Tokens
    among them) and an AnsweredInParts."""
    conversation = engine.conversation(document, settings)
    try:
        conversation.resume(turns)
        if conversation.answers_in_parts(question):
            return (yield from _answer_in_parts(engine, conversation, question, cancel))
        conversation.check_question(question, settings)  # before the document is read for it
        yield from conversation.open(cancel=cancel)
        selected = yield from conversation.select(question, cancel, settings)
        finder = conversation.source_finder() if settings.sources else None
        return replace(_taken(conversation.run, selected, sampler, conversation.settings, finder), unread=conversation.unread)
    finally:
        conversation.close()


def _answer_in_parts(engine: Engine, conversation: Conversation, question: str, cancel: threading.Event) -> Iterator[Event]:
    """The events of a question about the whole document answered in parts, but its Done, which
    it returns in an AnsweredInParts. The earlier turns play no part."""
    done = None
    for event in answer_in_parts(engine.conversation_for_part, conversation.document, question, conversation.settings,
                                 engine.model.count_tokens, cancel):
        if isinstance(event, Done):
            done = event
        else:
            yield event
    assert done is not None  # an answer ends with its Done
    return AnsweredInParts(done, unread=not conversation.saved)


def prepare_chat(
    engine: Engine, messages: Sequence[dict[str, str]], settings: AskSettings, cancel: threading.Event, sampler: Sampler
) -> Iterator[Event]:
    """As prepare_question, for a chat as the client sent it (a document pasted into a message,
    say). Everything before the observation window is saved once read, so the next request of
    the conversation (these messages, the answer, a new question) loads it and reads only what
    is new."""
    if not messages:
        raise SettingsError("the request has no messages", "send at least one user message")
    model = engine.model
    tokens = chat_tokens(model, list(messages))
    prefix = max(len(tokens) - settings.method.window, 0)
    states = engine.states.for_settings(settings) if engine.states is not None else None
    with PromptRun(model, context_size(model, len(tokens), settings, 64), settings, engine.model_name) as run:
        yield from run.open(tokens, prefix, states, "(chat messages)", cancel, MIN_SAVED_READING, restore_point=False)
        selected = yield from run.select(tokens, settings, 0, cancel)
        return _taken(run, selected, sampler, settings)


def _taken(
    run: PromptRun, selected: Selected, sampler: Sampler, settings: AskSettings, finder: SourceFinder | None = None
) -> PreparedPrompt:
    cache = run.cache
    first_token = sampler.sample(cache.ctx.handle)
    return PreparedPrompt(cache.saved(), first_token, selected, settings, finder)


def answer_sources(
    model: LlamaModel, prompt: PreparedPrompt, answer_tokens: list[int]
) -> tuple[tuple[Source, ...], tuple[float, ...]]:
    """The passages of the document an answer drew on and where its attention went along the
    text (answering/sources.py: Done's sources and attention), as a conversation finds them:
    the prompt's kept cells loaded on a context of their own, and the answer's tokens its
    sequence decoded (all but the last one taken; at most a batch) read after them with the
    attention probe on. Empty for a plain chat, with sources off, or for a one-token answer."""
    settings = prompt.settings
    answer_tokens = answer_tokens[:-1][: settings.n_batch]
    if prompt.finder is None or not answer_tokens:
        return (), ()
    kept = prompt.kept
    context = settings.layout.context(round_up(len(kept.positions) + len(answer_tokens) + 1), settings.n_batch, settings.threads)
    cache = KvCache(LlamaContext(model, context))
    with cache.ctx:
        cache.restore(kept)
        attention = cache.answer_attention(len(kept.positions), answer_tokens)
    if attention is None:
        return (), ()
    return prompt.finder.sources(*attention), prompt.finder.strip(*attention)
