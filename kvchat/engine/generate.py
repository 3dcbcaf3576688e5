"""Generation: llama.cpp's sampler chain, one token at a time, with the decode ring.

When the answer would overflow the context, the oldest answer tokens are evicted (never the
prompt: sinks, kept document entries and the question stay), so an answer can be longer than the
cache. Positions are repacked before they would pass the model's trained context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvchat.engine.cache import KvCache
from kvchat.errors import KvCacheFullError
from kvchat.events import Event, Evicted, Token
from kvchat.llama import Detokenizer, LlamaModel, Sampler

RING_EVICT_FRACTION = 4  # evict a quarter of the ring at a time: one compaction per many tokens


@dataclass
class Generation:
    """What generate() produced; filled in as it runs."""

    text: str = ""
    ended: bool = False  # the model ended its answer (generation may go on for timing)
    tokens: int = 0
    decoded: int = 0
    stop_reason: str = "max_tokens"
    first_token_at: float = 0.0
    decode_s: float = 0.0


def make_room(cache: KvCache, n_ctx: int, n_ctx_train: int, protected: int) -> Evicted | None:
    """Free one cell for the next token if needed: evict the oldest answer cells after the first
    `protected` cells; repack positions that would pass the trained context."""
    evicted = None
    if cache.cells + 1 > n_ctx:
        ring = cache.cells - protected
        if ring < 1:
            raise KvCacheFullError("the prompt fills the whole context", "raise --n-ctx or lower --budget")
        count = max(1, ring // RING_EVICT_FRACTION)
        keep = np.concatenate([np.arange(protected), np.arange(protected + count, cache.cells)])
        dropped = cache.keep_cells(keep)
        evicted = Evicted(count=len(dropped), positions=tuple(int(p) for p in dropped))
    if cache.next_pos + 1 > n_ctx_train:
        cache.repack()
    return evicted


def generate(
    cache: KvCache,
    model: LlamaModel,
    sampler: Sampler,
    max_tokens: int,
    result: Generation,
    cancel: threading.Event | None = None,
    stop_at_end: bool = True,
) -> Iterator[Event]:
    """Sample from the last logits, then decode one token at a time until the end or the limit.

    With stop_at_end=False it decodes `max_tokens` tokens in any case (benchmarks compare equal
    lengths); the answer's text is still what came before the model ended it.
    """
    detokenizer = Detokenizer(model)
    protected = cache.cells
    n_ctx_train = model.shape.n_ctx_train
    token = sampler.sample(cache.ctx.handle)
    result.first_token_at = time.perf_counter()
    while True:
        if not result.ended and model.is_end_of_generation(token):
            result.ended, result.stop_reason = True, "stop"
            if stop_at_end:
                break
        result.tokens += 1
        if not result.ended and (text := detokenizer.feed(token)):
            result.text += text
            yield Token(text)
        if result.tokens >= max_tokens:
            result.stop_reason = "stop" if result.ended else "max_tokens"
            break
        if cancel is not None and cancel.is_set():
            result.stop_reason = "cancelled"
            break
        started = time.perf_counter()
        if evicted := make_room(cache, cache.ctx.n_ctx, n_ctx_train, protected):
            yield evicted
        cache.decode([token], want_logits=True)
        result.decoded += 1
        token = sampler.sample(cache.ctx.handle)
        result.decode_s += time.perf_counter() - started
    if not result.ended and (tail := detokenizer.flush()):
        result.text += tail
        yield Token(tail)
