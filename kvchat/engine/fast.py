"""A fast reading (GemFilter, Shi et al. 2024): the model's first layers choose the tokens, and
the whole model reads only those.

Every decode of the cheap pass stops after layer r (LlamaContext.cut_after_layer), so reading
the whole prompt costs about r / n_layer of a full reading. The question's window observes at
those layers, the method chooses its budget from layer r's attention (the paper's choice; or the
sum over its last `fast_layers`), the
cache is emptied, and the whole model reads the chosen tokens alone: at consecutive positions
(the paper's), or moved back to their own positions afterwards (`fast_positions`). Either way
the cells remember which prompt token each holds (KvCache.origins), for the kept view and sources.

With a draft (`--draft`: a smaller model of the same vocabulary, as in Speculative Prefill, Liu et
al. 2025) the draft reads the whole prompt on a context of its own instead, with all its layers,
and its attention chooses as SnapKV's would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from kvchat.engine.cache import KvCache
from kvchat.engine.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, Progress, Pruned
from kvchat.llama import LlamaContext, LlamaModel


def last_read_layer(n_layer: int, depth: float) -> int:
    """The 0-based layer a cheap pass through `depth` of `n_layer` layers stops after."""
    return max(1, round(n_layer * depth)) - 1


@dataclass(frozen=True)
class Draft:
    """A smaller model with the same vocabulary that does a fast reading's cheap pass instead of
    the model's own first layers (Speculative Prefill): all its layers read the whole prompt."""

    model: LlamaModel
    name: str


def fast_select(
    cache: KvCache, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None,
    draft: Draft | None = None,
) -> Generator[Event, None, Selected]:
    """Into an empty `cache`: the kept prompt of `tokens` as a fast reading chooses it, and the
    last token's logits. Progress over the cheap pass, then Pruned; returns the Selected."""
    started = time.perf_counter()
    method, ctx, n_prompt = settings.method, cache.ctx, len(tokens)
    window_start = max(n_prompt - method.window, 0)
    yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
    if draft is None:
        last_layer = last_read_layer(ctx.model.shape.n_layer, settings.fast_depth)
        kept = yield from _first_layers(cache, tokens, settings, window_start, last_layer, cancel)
        read = f"fast {last_layer + 1}/{ctx.model.shape.n_layer}"
    else:
        kept = yield from _draft_pass(KvCache(LlamaContext(draft.model, ctx.settings)), tokens, settings, window_start, cancel)
        read = f"draft {draft.name}"
    cache.decode([tokens[p] for p in kept], want_logits=True)
    if settings.fast_positions == "original" and ctx.can_shift():
        cache.move_to(kept)
    cache.reset(cache.positions, cache.tokens, kept)  # the cells hold tokens[kept]
    window_s = time.perf_counter() - started
    yield Pruned(n_prompt, cache.cells, tuple(int(p) for p in kept), window_s, 0.0)
    return Selected(n_prompt, cache.cells, 0, 0.0, window_s, started, read=read)


def _first_layers(
    cache: KvCache, tokens: list[int], settings: AskSettings, window_start: int, last_layer: int,
    cancel: threading.Event | None,
) -> Generator[Event, None, np.ndarray]:
    """The cheap pass on the model itself: every decode stops after `last_layer`, and the votes of
    its last `fast_layers` choose. The tokens chosen; the cache is left empty (the layers above
    `last_layer` hold nothing usable)."""
    cache.ctx.cut_after_layer(last_layer)
    try:
        yield from cache.prefill(tokens[:window_start], 0, len(tokens), cancel)
        votes = cache.observe(tokens[window_start:])
    finally:
        cache.ctx.cut_after_layer(None)
    kept = cache.plan(settings.method, len(tokens) - window_start, votes[-settings.fast_layers :]).kept
    cache.clear()
    return kept


def _draft_pass(
    draft_cache: KvCache, tokens: list[int], settings: AskSettings, window_start: int, cancel: threading.Event | None
) -> Generator[Event, None, np.ndarray]:
    """The cheap pass on a draft model's context of its own (closed after): the tokens its every
    layer's votes choose."""
    with draft_cache.ctx:
        yield from draft_cache.prefill(tokens[:window_start], 0, len(tokens), cancel)
        votes = draft_cache.observe(tokens[window_start:])
        return draft_cache.plan(settings.method, len(tokens) - window_start, votes).kept
