"""The cheap pass of a fast reading (fast_reading.py), where attention chooses what the model reads
(GemFilter, Shi et al. 2024: the model's first layers choose the tokens, and the whole model reads
only those), and whether a fast reading pays and how long it takes.

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
from collections.abc import Generator
from dataclasses import dataclass, replace

import numpy as np

from kvchat.engine.drafts import Draft
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.sizing import RING_MIN, round_up
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.settings import AskSettings
from kvchat.events import Event
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


def question_reads_fast(n_prompt: int, settings: AskSettings, with_draft: bool, whole: bool) -> bool:
    """Whether a question of an `n_prompt`-token prompt reads fast, a whole reading under way
    aside (fast_is_sooner weighs it): where the settings ask for it, and it pays, or the document
    cannot be read whole (`whole` False: sizing.reads_whole), so that nothing else would read it."""
    return settings.reads_fast(with_draft) and (not whole or pays(n_prompt, settings, with_draft))


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


def make_room(cache: KvCache, cells: int) -> None:
    """Give `cache` a larger context where `cells` (and the least room for an answer) do not fit:
    a fast reading's context holds what it reads, not the document."""
    if cells + RING_MIN > cache.ctx.n_ctx:
        cache.recreate(replace(cache.ctx.settings, n_ctx=round_up(cells + RING_MIN)))


def cheap_pass_votes(
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
