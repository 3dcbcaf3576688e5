"""A prompt read and selected on a context of its own, its answer decoded on another: the server's
requests are prepared so (route.prepare, or prepare_chat for a chat of messages as the client sent
it), then moved into a sequence of its shared context (serving/slots.py). The sources of an answer
decoded so are found from the prepared prompt's kept cells (answer_sources).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from kvchat.engine.answering.attention import Attention, answer_attention
from kvchat.engine.answering.from_kept import sources_or_notice
from kvchat.engine.text.sources import SourceFinder
from kvchat.engine.kvcache.cache import KvCache, SavedCells
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.prompt import chat_tokens
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.selected import Selected
from kvchat.engine.reading.sizing import context_size, round_up
from kvchat.engine.settings import AskSettings
from kvchat.errors import SettingsError
from kvchat.events import Event, LaterReading, Notice, Source
from kvchat.llama import LlamaContext, LlamaModel, Sampler

MIN_SAVED_READING = 256  # shorter new readings of a chat are not worth a state file


@dataclass
class PreparedPrompt:
    kept: SavedCells  # the kept cells, as a one-sequence state, and what they hold
    first_token: int  # the answer's first token, sampled from the logits of the whole prompt
    selected: Selected  # the prompt's length, the cells kept and loaded, the reading's and the selection's time
    settings: AskSettings  # those it was read with: the request's, or streamed for a long document
    finder: SourceFinder | None = None  # about a document, with sources on: what names an answer's sources
    read_later: LaterReading | None = None  # a fast reading answered: the document is to be read so (Done.read_later)


def kept_prompt(
    run: PromptRun, selected: Selected, sampler: Sampler, settings: AskSettings, finder: SourceFinder | None = None,
    read_later: LaterReading | None = None,
) -> PreparedPrompt:
    """What `run` kept of its prompt, and the answer's first token `sampler` draws from the logits
    the observation window left (as in a single ask, the first token sees the whole prompt; the
    rest see what was kept)."""
    cache = run.cache
    first_token = sampler.sample(cache.ctx.handle)
    return PreparedPrompt(cache.saved(), first_token, selected, settings, finder, read_later)


def prepare_chat(
    model: LlamaModel, model_name: str, states: DocumentStates | None, messages: Sequence[dict[str, str]],
    settings: AskSettings, sampler: Sampler, cancel: threading.Event,
) -> Generator[Event, None, PreparedPrompt]:
    """As route.prepare, for a chat as the client sent it (a document pasted into a message, say).
    Everything before the observation window is saved once read (in `states`, the engine's), so
    the next request of the conversation (these messages, the answer, a new question) loads it
    and reads only what is new."""
    if not messages:
        raise SettingsError("the request has no messages", "send at least one user message")
    tokens = chat_tokens(model, list(messages))
    prefix = max(len(tokens) - settings.method.window, 0)
    states = states.for_settings(settings) if states is not None else None
    with PromptRun(model, context_size(model, len(tokens), settings, 64), settings, model_name) as run:
        yield from run.open(tokens, prefix, states, "(chat messages)", cancel, MIN_SAVED_READING, restore_point=False)
        selected = yield from run.select(tokens, settings, 0, cancel)
        return kept_prompt(run, selected, sampler, settings)


def answer_sources(
    model: LlamaModel, prompt: PreparedPrompt, answer_tokens: list[int]
) -> tuple[tuple[Source, ...], tuple[float, ...], Notice | None]:
    """The passages of the document an answer drew on, where its attention went along the text,
    and the Notice of a failure to find them (from_kept.sources_or_notice), as a conversation finds
    them: the prompt's kept cells loaded on a context of their own, and the answer's tokens its
    sequence decoded (all but the last one taken; at most a batch) read after them with the
    attention probe on. Empty for a plain chat, with sources off, or for a one-token answer."""
    settings = prompt.settings
    answer_tokens = answer_tokens[:-1][: settings.n_batch]
    if prompt.finder is None or not answer_tokens:
        return (), (), None

    def attention() -> Attention | None:
        kept = prompt.kept
        context = settings.layout.context(round_up(len(kept.positions) + len(answer_tokens) + 1), settings.n_batch,
                                          settings.threads)
        cache = KvCache(LlamaContext(model, context))
        with cache.ctx:
            cache.restore(kept)
            return answer_attention(cache, len(kept.positions), answer_tokens)

    return sources_or_notice(prompt.finder, attention)
