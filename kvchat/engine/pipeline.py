"""The steps of one answer on a llama.cpp context: prefill, observe, prune, compact, generate.

Each step is a small generator or function over a LlamaContext so that later features (saved
states, the streaming ring, the bench) can recombine them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvchat.errors import CancelledError, KvchatError
from kvchat.events import Progress, Pruned, Token
from kvchat.llama import Detokenizer, LlamaContext, Sampler
from kvchat.policy import PrunePlan, SnapKV, spans_from_pieces


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CancelledError("stopped", "")


def prefill(
    ctx: LlamaContext,
    tokens: list[int],
    start_pos: int,
    total: int,
    cancel: threading.Event | None = None,
) -> Iterator[Progress]:
    """Decode `tokens` from `start_pos` in batches, yielding progress over `total` tokens."""
    started = time.perf_counter()
    step = ctx.settings.n_batch
    for offset in range(0, len(tokens), step):
        check_cancel(cancel)
        batch = tokens[offset : offset + step]
        ctx.decode(batch, start_pos + offset, want_logits=False)
        done = start_pos + offset + len(batch)
        yield Progress(done=done, total=total, elapsed_s=time.perf_counter() - started)


def observe(ctx: LlamaContext, window_tokens: list[int], start_pos: int) -> np.ndarray:
    """Decode the observation window with the probe on; votes (n_layer, n_head, n_cells).

    The cache must be hole-free here (cell index == position) so columns are positions.
    """
    if ctx.probe is None:
        raise KvchatError("attention scores need flash attention off", "drop --flash-attn")
    ctx.probe.start(start_pos + len(window_tokens))
    try:
        ctx.decode(window_tokens, start_pos)
    except BaseException:
        ctx.probe.abort()
        raise
    return ctx.probe.stop()


def plan_prune(
    policy: SnapKV, votes: np.ndarray, pieces: list[str] | None, pins: np.ndarray | None = None
) -> PrunePlan:
    span_ids = spans_from_pieces(pieces) if policy.spans and pieces is not None else None
    return policy.plan(votes, span_ids=span_ids, extra_pins=pins)


def apply_plan(ctx: LlamaContext, plan: PrunePlan, seq: int = 0) -> tuple[float, float]:
    """Remove the dropped runs, compact, verify. Returns (remove seconds, compact seconds)."""
    started = time.perf_counter()
    ctx.remove_runs(seq, plan.drop_runs)
    removed = time.perf_counter()
    ctx.compact(seq)
    compacted = time.perf_counter()
    verify_cache(ctx, plan.kept, seq)
    return removed - started, compacted - removed


def verify_cache(ctx: LlamaContext, expected_positions: np.ndarray, seq: int = 0) -> None:
    """The cache holds exactly the planned positions, densely from cell 0, in order."""
    positions = ctx.positions(seq)
    if len(positions) != len(expected_positions) or not np.array_equal(positions, expected_positions):
        raise KvchatError(
            f"KV cache check failed: {len(positions)} cells, {len(expected_positions)} planned",
            "please report this with the log file",
        )


@dataclass
class Generation:
    """What generate() produced; filled in as it runs."""

    text: str = ""
    tokens: int = 0
    decoded: int = 0
    stop_reason: str = "max_tokens"
    first_token_at: float = 0.0
    decode_s: float = 0.0


def generate(
    ctx: LlamaContext,
    sampler: Sampler,
    detokenizer: Detokenizer,
    next_pos: int,
    max_tokens: int,
    result: Generation,
    cancel: threading.Event | None = None,
    stop_at_end: bool = True,
) -> Iterator[Token]:
    """Sample from the last logits, then decode one token at a time until end or the limit."""
    model = ctx.model
    token = sampler.sample(ctx.handle)
    result.first_token_at = time.perf_counter()
    while True:
        if stop_at_end and model.is_end_of_generation(token):
            result.stop_reason = "stop"
            break
        result.tokens += 1
        if text := detokenizer.feed(token):
            result.text += text
            yield Token(text)
        if result.tokens >= max_tokens:
            result.stop_reason = "max_tokens"
            break
        if cancel is not None and cancel.is_set():
            result.stop_reason = "cancelled"
            break
        started = time.perf_counter()
        ctx.decode([token], next_pos)
        result.decoded += 1
        next_pos += 1
        token = sampler.sample(ctx.handle)
        result.decode_s += time.perf_counter() - started
    if tail := detokenizer.flush():
        result.text += tail
        yield Token(tail)


def pruned_event(plan: PrunePlan, observe_s: float, compact_s: float) -> Pruned:
    return Pruned(
        prompt_tokens=plan.n_tokens,
        kept_tokens=plan.n_kept,
        kept_positions=tuple(int(p) for p in plan.kept),
        observe_s=observe_s,
        compact_s=compact_s,
    )
