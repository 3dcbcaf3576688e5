"""A fast reading (GemFilter, Shi et al. 2024): the model's first layers choose the tokens, and
the whole model reads only those.

Every decode of the cheap pass stops after layer r (LlamaContext.cut_after_layer), so reading
the whole prompt costs about r / n_layer of a full reading. The question's window observes at
those layers, the method chooses its budget from layer r's attention (the paper's choice; or the
sum over its last `fast_layers`), the
cache is emptied, and the whole model reads the chosen tokens alone: at consecutive positions
(the paper's), or moved back to their own positions afterwards (`fast_positions`). Either way
the cells remember which prompt token each holds (KvCache.origins), for the kept view and sources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

from kvchat.engine.cache import KvCache
from kvchat.engine.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, Progress, Pruned


def last_read_layer(n_layer: int, depth: float) -> int:
    """The 0-based layer a cheap pass through `depth` of `n_layer` layers stops after."""
    return max(1, round(n_layer * depth)) - 1


def fast_select(
    cache: KvCache, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None
) -> Generator[Event, None, Selected]:
    """Into an empty `cache`: the kept prompt of `tokens` as a fast reading chooses it, and the
    last token's logits. Progress over the cheap pass, then Pruned; returns the Selected."""
    started = time.perf_counter()
    method, ctx, n_prompt = settings.method, cache.ctx, len(tokens)
    window_start = max(n_prompt - method.window, 0)
    last_layer = last_read_layer(ctx.model.shape.n_layer, settings.fast_depth)
    ctx.cut_after_layer(last_layer)
    try:
        yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
        yield from cache.prefill(tokens[:window_start], 0, n_prompt, cancel)
        votes = cache.observe(tokens[window_start:])
    finally:
        ctx.cut_after_layer(None)
    kept = cache.plan(method, n_prompt - window_start, votes[-settings.fast_layers :]).kept
    cache.clear()
    cache.decode([tokens[p] for p in kept], want_logits=True)
    if settings.fast_positions == "original" and ctx.can_shift():
        cache.move_to(kept)
    cache.reset(cache.positions, cache.tokens, kept)  # the cells hold tokens[kept]
    window_s = time.perf_counter() - started
    yield Pruned(n_prompt, cache.cells, tuple(int(p) for p in kept), window_s, 0.0)
    return Selected(n_prompt, cache.cells, 0, 0.0, window_s, started, read_layers=last_layer + 1)
