"""A fast reading (GemFilter, Shi et al. 2024): the model's first layers choose the tokens, and
the whole model reads only those.

Every decode of the cheap pass stops after layer r (LlamaContext.cut_after_layer), so reading
the whole prompt costs about r / n_layer of a full reading. The question's window observes at
those layers, the method chooses its budget from layer r's attention (the paper's choice; or the
sum over its last `layers`, FastSettings), the
cache is emptied, and the whole model reads the chosen tokens alone: at consecutive positions
(the paper's), or moved back to their own positions afterwards (`positions`). Either way
the cells remember which prompt token each holds (KvCache.origins), for the kept view and sources.

With a draft (`--draft`: a smaller model of the same vocabulary, as in Speculative Prefill, Liu et
al. 2025) the draft's first layers read the whole prompt on a context of its own instead, and
their attention chooses as SnapKV's would. How many layers a cheap pass runs is the registry's
measured share for the model running it (models/registry.py), unless FastSettings' `depth` says.

The cheap pass may choose more than the budget (`reread`; with a draft, four times the budget
unless told): the whole model then reads those, the question's window observes that reading with
every layer, and SnapKV keeps the budget's of them, so the tokens kept were written having read
more than themselves. The cheap pass chooses what to re-read otherwise than the method keeps: in
whole sentences or clauses of the text (`spans`), each scored by its strongest head (`heads`), as
Speculative Prefill scores its chunks, so that the model re-reads passages, not scattered words.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, replace

import numpy as np

from kvchat.engine.drafts import Draft
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.passage_bank import PassageBank, load_passages_of
from kvchat.engine.text.passages import Passages, Question, names_the_document
from kvchat.engine.reading.selected import Selected
from kvchat.engine.reading.sizing import RING_MIN, round_up
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, Progress
from kvchat.llama import LlamaContext
from kvchat.models.registry import DEFAULT_CHEAP_DEPTH
from kvchat.policy import HeadReduction, Method


# With a draft the model re-reads this many times the budget when not told, and keeps the budget's:
# at 16K tokens the draft's first half choosing 4,096 read as fast as, and answered better than, all of
# it choosing 1,024 (docs/bench/design-history.md, "The cheap pass"). The model's own cheap pass re-reads the budget (GemFilter).
DRAFT_REREAD = 4
# A fast reading pays while the model re-reads less than this share of the prompt: the cheap pass
# costs about a third of a full reading (the draft's first half, at 6.9K and at 16K tokens).
PAYS_BELOW = 2 / 3


def reread_tokens(settings: AskSettings, with_draft: bool) -> int:
    """How many of the prompt's tokens the cheap pass chooses for the model to read: four times
    the budget when a draft's attention chooses, the budget otherwise (the question's words, or the
    model's own first layers)."""
    fast = settings.fast_reading
    by_draft = with_draft and fast.choose != "bm25"
    return fast.reread or settings.method.budget * (DRAFT_REREAD if by_draft else 1)


def pays(n_prompt: int, settings: AskSettings, with_draft: bool) -> bool:
    """Whether a fast reading of `n_prompt` tokens is faster than reading them all."""
    return reread_tokens(settings, with_draft) < PAYS_BELOW * n_prompt


def fast_reading_s(n_prompt: int, settings: AskSettings, speeds: ReadingSpeeds | None) -> float | None:
    """How long a fast reading of `n_prompt` tokens takes here, at its last measured speed; None
    before one was measured."""
    speed = speeds.measured(speed_kind(settings)) if speeds is not None else None  # tokens/s
    return n_prompt / speed if speed else None


def fast_is_sooner(fast_s: float | None, left_s: float | None) -> bool:
    """Whether a fast reading taking `fast_s` answers sooner than awaiting the `left_s` seconds a
    whole reading under way still needs (then selecting from it); sooner when either is not known
    (a fast reading takes seconds where a whole one takes minutes)."""
    return fast_s is None or left_s is None or left_s >= fast_s


def speed_kind(settings: AskSettings) -> str:
    """What a fast reading's speed is remembered as (speeds.py): each way of choosing has its own
    pace (the question's words choose in no time; a draft's pass costs a third of a reading)."""
    choose = settings.fast_reading.choose
    return "fast" if choose == "attention" else f"fast {choose}"


def last_read_layer(n_layer: int, depth: float) -> int:
    """The 0-based layer a cheap pass through `depth` of `n_layer` layers stops after."""
    return max(1, round(n_layer * depth)) - 1


@dataclass(frozen=True)
class CheapPass:
    """Who does a fast reading's cheap pass: a draft, a smaller model with the same vocabulary
    (Speculative Prefill), or (`draft` None) the model's own first layers. `depth`: the share of
    its layers that reads, looked up once in the registry for the model that reads
    (models.cheap_depth)."""

    depth: float = DEFAULT_CHEAP_DEPTH
    draft: Draft | None = None

    @property
    def drafted(self) -> bool:
        return self.draft is not None

    def trained(self, cache: KvCache) -> int:
        """The positions the cheap pass's model was trained on: the draft's, or `cache`'s model's."""
        return (self.draft.model() if self.draft is not None else cache.ctx.model).shape.n_ctx_train

    @property
    def label(self) -> str:
        """How a reading's stats name it: "draft small," or "fast" (the model's own layers)."""
        return f"draft {self.draft.name}," if self.draft is not None else "fast"


def fast_select(
    cache: KvCache, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None,
    cheap_pass: CheapPass = CheapPass(), question: Question | None = None, bank: PassageBank | None = None,
) -> Generator[Event, None, Selected]:
    """Into an empty `cache`: the kept prompt of `tokens` as a fast reading chooses it, and the
    last token's logits. Progress over the cheap pass (if any), then over the model's reading of
    the chosen tokens, then Pruned; returns the Selected. `cancel` stops either part-way through
    its batch. `question`: its text and the document's passages, for a choice by its words, and the
    earlier turns, read and kept whatever the method keeps; `bank`: those passages' reading
    (passage_bank.py), from which the chosen ones are loaded instead of read."""
    started = time.perf_counter()
    ctx, n_prompt = cache.ctx, len(tokens)
    reread = reread_tokens(settings, cheap_pass.drafted)
    window_start = max(n_prompt - settings.method.window, 0)  # the question's window observes from here
    yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
    body, read = yield from _choose(cache, tokens, window_start, settings, reread, cheap_pass, question, cancel)
    make_room(cache, len(body) + n_prompt - window_start + settings.max_tokens)  # the answer may use the ring past that
    ctx = cache.ctx
    n_loaded = 0
    if bank is not None and question is not None:  # the chosen passages' reading is banked: loaded, not read
        loaded = load_passages_of(cache, bank, question.passages, body, tokens)
        body, n_loaded = np.setdiff1d(body, loaded), len(loaded)
        read += f", {n_loaded:,} loaded"
    yield from cache.prefill_chosen(tokens, body, window_start, cancel)  # the second pass; the question's window follows
    window = tokens[window_start:]
    compact_s = 0.0
    if reread > settings.method.budget and len(body) + len(window) > settings.method.budget:
        turns = _cells_of(body, question.earlier_turns) if question is not None and question.n_earlier else None
        compact_s = cache.keep_chosen_by(window, settings.method, turns)  # the question's attention over the re-reading keeps the budget's
        read += f", {len(body) + len(window):,} re-read"
    else:
        cache.decode(window, want_logits=True)
    if settings.fast_reading.positions == "original" and ctx.can_shift():
        cache.move_to(cache.origins)  # llama.cpp reads a batch only right after the last position
    window_s = time.perf_counter() - started - compact_s
    yield cache.pruned(n_prompt, window_s, compact_s)
    return Selected(n_prompt, cache.cells, n_loaded, 0.0, window_s, started, read=read)


def _choose(
    cache: KvCache, tokens: list[int], window_start: int, settings: AskSettings, reread: int, cheap_pass: CheapPass,
    question: Question | None, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, str]]:
    """The prompt's tokens before the question's window that the model reads (sorted), and how they
    were chosen: by a cheap pass's attention, or (bm25) by the question's words where it shares
    some with the document's passages, else by the cheap pass's attention over those passages.
    The earlier turns of a conversation are read whatever chooses. A prompt longer than the cheap
    pass's model was trained on is read by it in groups of passages (_attention_in_groups)."""
    fast = settings.fast_reading
    passages = question.passages if question is not None else None
    def most() -> int:  # what one cheap pass reads besides the window (its model loaded to know: not for the words' choice)
        return cheap_pass.trained(cache) - (len(tokens) - window_start) - RING_MIN

    if passages is None or not len(passages.starts) or (fast.choose == "attention" and window_start <= most()):
        origins, kept, _, layers = yield from _cheap_pass(cache, tokens, None, window_start, settings, reread, cheap_pass, cancel)
        turns = question.earlier_turns if question is not None else np.zeros(0, dtype=np.int64)
        return np.union1d(_before(origins[kept], window_start), _before(turns, window_start)), f"{cheap_pass.label} {layers} layers"
    if fast.choose != "attention":
        words = passages.bm25(question.text)
        if (words > 0).any():
            opening = fast.opening if fast.opening_for == "every" or names_the_document(question.text) else 0
            chosen = passages.top(words, reread, opening)
            return passages.tokens_of(chosen, window_start), f"bm25{' and the opening' if opening else ''}, {len(chosen)} passages"
    attention, layers = yield from _attention_in_groups(cache, tokens, window_start, settings, reread, cheap_pass, passages,
                                                        most(), cancel)
    chosen = passages.top(np.where(np.isfinite(attention), attention, -np.inf), reread, fast.opening)
    return passages.tokens_of(chosen, window_start), f"{cheap_pass.label} {layers} layers, {len(chosen)} passages"


def _attention_in_groups(
    cache: KvCache, tokens: list[int], window_start: int, settings: AskSettings, reread: int, cheap_pass: CheapPass,
    passages: Passages, most: int, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, str]]:
    """Each passage's score by the cheap pass's attention (Passages.attention) and the layers read:
    every passage read at once where the prompt fits `most` tokens, else in consecutive groups
    that each do, each read after the prompt's opening with the question's window observing (as
    a retrieval tool scores its chunks apart), their progress told as one reading's."""
    groups = _groups(passages, window_start, most)
    attention, layers, done = np.full(len(passages.starts), -np.inf), "", 0
    total = sum(len(group) for group in groups)
    for read in groups:
        run = _cheap_pass(cache, tokens, read, window_start, settings, reread, cheap_pass, cancel)
        origins, _, scores, layers = yield from _told_from(run, done, total)
        attention = np.maximum(attention, passages.attention(scores, origins[: len(scores)]))
        done += len(read)
    return attention, layers


def _groups(passages: Passages, window_start: int, most: int) -> list[np.ndarray]:
    """The prompt indices that read the document's passages (Passages.tokens_of) in consecutive
    groups of at most `most` tokens each (one passage at least); one group where all fit."""
    every = np.arange(len(passages.starts))
    opening = len(passages.tokens_of(every[:0], window_start))  # read with every group
    lengths = passages.lengths + (passages.mark_ends - passages.mark_starts)  # a page's mark counted with each of its passages
    groups: list[list[int]] = [[]]
    size = opening
    for index, length in enumerate(lengths.tolist()):
        if groups[-1] and size + length > most:
            groups.append([])
            size = opening
        groups[-1].append(index)
        size += length
    return [passages.tokens_of(np.asarray(group, dtype=np.int64), window_start) for group in groups]


def _told_from(
    run: Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]], done: int, total: int,
) -> Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
    """`run`'s events, its Progress told as part of a reading of `total` tokens begun `done` tokens ago."""
    while True:
        try:
            event = next(run)
        except StopIteration as finished:
            return finished.value
        yield replace(event, done=done + event.done, total=total) if isinstance(event, Progress) else event


def make_room(cache: KvCache, cells: int) -> None:
    """Give `cache` a larger context where `cells` (and the least room for an answer) do not fit:
    a fast reading's context holds what it reads, not the document."""
    if cells + RING_MIN > cache.ctx.n_ctx:
        cache.recreate(replace(cache.ctx.settings, n_ctx=round_up(cells + RING_MIN)))


def _cells_of(body: np.ndarray, turns: np.ndarray) -> tuple[int, int]:
    """The [start, end) cells of the sorted `body` that hold the earlier `turns` (consecutive
    prompt indices; the question's window may hold their last ones instead)."""
    return int(np.searchsorted(body, turns[0])), int(np.searchsorted(body, turns[-1], side="right"))


def _before(indices: np.ndarray, window_start: int) -> np.ndarray:
    """The prompt indices a cheap pass kept, less the question's window (read after them)."""
    return indices[indices < window_start]


def _cheap_pass(
    cache: KvCache, tokens: list[int], read: np.ndarray | None, window_start: int, settings: AskSettings, reread: int,
    cheap_pass: CheapPass, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
    """The prompt's tokens before `window_start` (or those at its indices `read`) read by the first
    `depth` of the cheap pass's model's layers (every decode stops after the last of them; the
    draft's on a context of its own, or `cache`'s model's, emptied after), the question's window
    observing. Returns each cell's prompt index, the cells the votes of the last `layers` of those
    layers choose (as SnapKV would keep `reread` of them, in sentences: FastSettings), each
    read token's score (its heads' votes summed), and the layers read ("12/24")."""
    fast = settings.fast_reading
    method = replace(settings.method, budget=reread, spans=fast.spans, heads=HeadReduction(fast.heads))
    cells = (window_start if read is None else len(read)) + len(tokens) - window_start  # what it reads and observes with
    if cheap_pass.draft is None:
        make_room(cache, cells)
        found = yield from _observed(cache, tokens, read, window_start, method, fast.depth or cheap_pass.depth, fast.layers, cancel)
        cache.clear()  # the layers above the cut hold nothing usable
        return found
    draft = cheap_pass.draft.model()
    draft_settings = replace(cache.ctx.settings, n_ctx=round_up(cells + RING_MIN))
    with LlamaContext(draft, draft_settings) as draft_ctx:  # the draft's votes of every layer it ran choose
        return (yield from _observed(KvCache(draft_ctx), tokens, read, window_start, method, fast.depth or cheap_pass.depth,
                                     draft.shape.n_layer, cancel))


def _observed(
    cache: KvCache, tokens: list[int], read: np.ndarray | None, window_start: int, method: Method, depth: float,
    scoring_layers: int, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
    n_layer = cache.ctx.model.shape.n_layer
    last_layer = last_read_layer(n_layer, depth)
    cache.ctx.cut_after_layer(None if last_layer == n_layer - 1 else last_layer)
    try:
        if read is None:
            yield from cache.prefill(tokens[:window_start], 0, len(tokens), cancel)
        else:
            yield from cache.prefill_chosen(tokens, read, window_start, cancel)
        votes = cache.observe(tokens[window_start:])[-scoring_layers:]
    finally:
        cache.ctx.cut_after_layer(None)
    window = len(tokens) - window_start
    kept = cache.plan(method, window, votes).kept
    scores = votes[..., :-window].sum(axis=(0, 1), dtype=np.float64)
    return cache.origins.copy(), kept, scores, f"{last_layer + 1}/{n_layer}"
