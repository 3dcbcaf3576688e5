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

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, Progress
from kvchat.llama import LlamaContext, LlamaModel
from kvchat.models.registry import DEFAULT_CHEAP_DEPTH
from kvchat.policy import HeadReduction, Method


# With a draft the model re-reads this many times the budget when not told, and keeps the budget's:
# at 16K tokens the draft's first half choosing 4,096 read as fast as, and answered better than, all of
# it choosing 1,024 (docs/how-it-works.md, "Reading fast"). The model's own cheap pass re-reads the budget (GemFilter).
DRAFT_REREAD = 4
# A fast reading pays while the model re-reads less than this share of the prompt: the cheap pass
# costs about a third of a full reading (the draft's first half, at 6.9K and at 16K tokens).
PAYS_BELOW = 2 / 3


def reread_tokens(settings: AskSettings, with_draft: bool) -> int:
    """How many of the prompt's tokens the cheap pass chooses for the model to read."""
    return settings.fast.reread or settings.method.budget * (DRAFT_REREAD if with_draft else 1)


def pays(n_prompt: int, settings: AskSettings, with_draft: bool) -> bool:
    """Whether a fast reading of `n_prompt` tokens is faster than reading them all."""
    return reread_tokens(settings, with_draft) < PAYS_BELOW * n_prompt


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
    draft: LlamaModel | None = None
    name: str = ""  # the draft's

    @property
    def drafted(self) -> bool:
        return self.draft is not None


def fast_select(
    cache: KvCache, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None,
    cheap_pass: CheapPass = CheapPass(),
) -> Generator[Event, None, Selected]:
    """Into an empty `cache`: the kept prompt of `tokens` as a fast reading chooses it, and the
    last token's logits. Progress over the cheap pass, then over the model's reading of the chosen
    tokens, then Pruned; returns the Selected. `cancel` is seen after each batch of either."""
    started = time.perf_counter()
    ctx, n_prompt = cache.ctx, len(tokens)
    draft = cheap_pass.draft
    chooser = replace(settings.method, budget=reread_tokens(settings, cheap_pass.drafted), spans=settings.fast.spans,
                      heads=HeadReduction(settings.fast.heads))
    depth = settings.fast.depth or cheap_pass.depth
    window_start = max(n_prompt - settings.method.window, 0)  # the question's window observes from here
    yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
    if draft is None:
        kept, layers = yield from _cheap_pass(cache, tokens, window_start, chooser, depth, settings.fast.layers, cancel)
        cache.clear()  # the layers above the cut hold nothing usable
        read = f"fast {layers} layers"
    else:
        with LlamaContext(draft, ctx.settings) as draft_ctx:  # the draft's votes of every layer it ran choose
            kept, layers = yield from _cheap_pass(
                KvCache(draft_ctx), tokens, window_start, chooser, depth, draft.shape.n_layer, cancel)
        read = f"draft {cheap_pass.name}, {layers} layers"
    body = kept[kept < window_start]  # the chosen tokens before the question's window
    yield from cache.prefill_chosen(tokens, body, window_start, cancel)  # the second pass; the question's window follows
    window = tokens[window_start:]
    compact_s = 0.0
    if len(kept) > settings.method.budget:  # the question's attention over the re-reading keeps the budget's
        compact_s = cache.keep_chosen_by(window, settings.method)
        read += f", {len(kept):,} re-read"
    else:
        cache.decode(window, want_logits=True)
    if settings.fast.positions == "original" and ctx.can_shift():
        cache.move_to(cache.origins)  # llama.cpp reads a batch only right after the last position
    window_s = time.perf_counter() - started - compact_s
    yield cache.pruned(n_prompt, window_s, compact_s)
    return Selected(n_prompt, cache.cells, 0, 0.0, window_s, started, read=read)


def _cheap_pass(
    cache: KvCache, tokens: list[int], window_start: int, method: Method, depth: float, scoring_layers: int,
    cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, str]]:
    """The prompt read by the first `depth` of `cache`'s model's layers (every decode stops after
    the last of them), the question's window (from `window_start`) observing: the tokens the votes
    of the last `scoring_layers` of those layers choose, and the layers read ("14/28")."""
    n_layer = cache.ctx.model.shape.n_layer
    last_layer = last_read_layer(n_layer, depth)
    cache.ctx.cut_after_layer(None if last_layer == n_layer - 1 else last_layer)
    try:
        yield from cache.prefill(tokens[:window_start], 0, len(tokens), cancel)
        votes = cache.observe(tokens[window_start:])
    finally:
        cache.ctx.cut_after_layer(None)
    kept = cache.plan(method, len(tokens) - window_start, votes[-scoring_layers:]).kept
    return kept, f"{last_layer + 1}/{n_layer}"
