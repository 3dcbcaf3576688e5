"""Generation: llama.cpp's sampler chain, one token at a time, with the decode ring; an answer's stats.

When the answer would overflow the context, the oldest answer tokens are evicted (never the
prompt: sinks, kept document entries and the question stay), so an answer can be longer than the
cache. Positions are repacked before they would pass the model's trained context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.errors import KvCacheFullError
from kvchat.events import Event, Evicted, Stats, Token
from kvchat.llama import Detokenizer, LlamaModel, Sampler

RING_EVICT_FRACTION = 4  # evict a quarter of the ring at a time: one compaction per many tokens


class Generation:
    """One answer's tokens becoming its text: the end of generation, the token limit, the
    detokenizer and its flush, the stop reason and the timings. generate() feeds it from one
    context; the server's scheduler feeds every answer of a batched decode step the same way."""

    def __init__(self, model: LlamaModel, max_tokens: int) -> None:
        self._model = model
        self._max_tokens = max_tokens
        self._detokenizer = Detokenizer(model)
        self.text = ""
        self.ended = False  # the model ended its answer
        self.over = False  # nothing more is to be decoded
        self.tokens = 0
        self.token_ids: list[int] = []  # every token taken, the end of generation included
        self.stop_reason = "max_tokens"
        self.first_token_at = 0.0
        self.decode_s = 0.0

    def add(self, token: int) -> str:
        """Take the next sampled token; returns the text it adds ('' for none)."""
        if not self.first_token_at:
            self.first_token_at = time.perf_counter()
        self.token_ids.append(token)
        if self._model.is_end_of_generation(token):
            self.ended = self.over = True
            self.stop_reason = "stop"
            return ""
        self.tokens += 1
        text = self._detokenizer.feed(token)
        self.text += text
        if self.tokens >= self._max_tokens:
            self.stop_reason, self.over = "max_tokens", True
        return text

    def count_step(self, seconds: float) -> None:
        """Add one decode step's time: the stats' decode speed."""
        self.decode_s += seconds

    def stop(self, reason: str) -> None:
        """End the answer early: "cancelled", or "max_tokens" when no cell is left for it."""
        self.stop_reason, self.over = reason, True

    def flush(self) -> str:
        """The text the detokenizer still holds (a character cut short by the limit or a stop)."""
        tail = "" if self.ended else self._detokenizer.flush()
        self.text += tail
        return tail


def answer_stats(
    model: LlamaModel,
    model_name: str,
    settings: AskSettings,
    prompt: Selected,
    generation: Generation,
    began: float,
    peak_cells: int,
) -> Stats:
    """The stats of one answer, for ask, conversations and the server alike. `began` is when the
    answer's wait began (the reading it counts included; a server request: when it arrived)."""
    bytes_per_token = model.shape.kv_bytes_per_token(settings.layout.type_k, settings.layout.type_v)
    decoded = max(generation.tokens - 1, 0)
    now = time.perf_counter()
    return Stats(
        model=model_name,
        method=settings.method.name,
        budget=settings.method.budget,
        prompt_tokens=prompt.n_prompt,
        kept_tokens=prompt.kept,
        loaded_tokens=prompt.loaded_tokens,
        generated_tokens=generation.tokens,
        kv_bytes_full=prompt.n_prompt * bytes_per_token,
        kv_bytes_kept=prompt.kept * bytes_per_token,
        prefill_tokens_per_s=prompt.n_prompt / max(prompt.reading_s + prompt.window_s, 1e-9),
        decode_tokens_per_s=decoded / generation.decode_s if generation.decode_s > 0 else 0.0,
        ttft_s=(generation.first_token_at or now) - began,
        total_s=now - began,
        peak_cells=peak_cells,
        stop_reason=generation.stop_reason,
        read=prompt.read,
    )


def make_room(cache: KvCache, n_ctx: int, n_ctx_train: int, protected: int) -> Evicted | None:
    """Free one cell for the next token if needed: evict the oldest answer cells after the first
    `protected` cells; repack positions that would pass the trained context."""
    evicted = None
    if cache.cells + 1 > n_ctx:
        ring = cache.cells - protected
        if ring < 1:
            raise KvCacheFullError("the prompt fills the whole context", "raise `n_ctx` or lower `budget`")
        count = max(1, ring // RING_EVICT_FRACTION)
        keep = np.concatenate([np.arange(protected), np.arange(protected + count, cache.cells)])
        dropped = cache.keep_cells(keep)
        evicted = Evicted(count=len(dropped), positions=tuple(int(p) for p in dropped))
    if cache.next_pos + 1 > n_ctx_train:
        cache.repack()
    return evicted


def generate(
    cache: KvCache,
    sampler: Sampler,
    generation: Generation,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Sample from the last logits, then decode one token at a time until `generation` is over."""
    protected = cache.cells
    n_ctx_train = cache.ctx.model.shape.n_ctx_train
    token = sampler.sample(cache.ctx.handle)
    while True:
        if text := generation.add(token):
            yield Token(text)
        if generation.over:
            break
        if cancel is not None and cancel.is_set():
            generation.stop("cancelled")
            break
        started = time.perf_counter()
        if evicted := make_room(cache, cache.ctx.n_ctx, n_ctx_train, protected):
            yield evicted
        cache.decode([token], want_logits=True)
        token = sampler.sample(cache.ctx.handle)
        generation.count_step(time.perf_counter() - started)
    if tail := generation.flush():
        yield Token(tail)
