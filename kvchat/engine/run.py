"""A prompt on its own llama.cpp context: read once, then finish it (prune + answer) many times.

`ask`, conversations, the bench and the tests share this one path: read a prefix of the
prompt (or load a saved state of it), then `finish` decodes the rest, observes the window,
prunes, compacts and generates. `save()`/`restore()` let several settings start from one read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from collections.abc import Iterator

import numpy as np

from kvchat.engine.pipeline import Generation, apply_plan, generate, observe, plan_prune, prefill, pruned_event
from kvchat.engine.settings import AskSettings
from kvchat.events import Done, Event, Progress, Stats
from kvchat.llama import ContextSettings, Detokenizer, LlamaContext, LlamaModel, Sampler


class PromptRun:
    """Owns a context; `read_upto` tokens of the current prompt are in its cache."""

    def __init__(self, model: LlamaModel, n_ctx: int, settings: AskSettings, model_name: str) -> None:
        self.model = model
        self.model_name = model_name
        self._context_settings = ContextSettings(n_ctx=n_ctx, n_batch=settings.n_batch, threads=settings.threads)
        self.ctx = LlamaContext(model, self._context_settings)
        self.read_upto = 0
        self.cells = 0  # KV cells the sequence holds now
        self.read_s = 0.0
        self._saved: tuple[bytes | bytearray, int] | None = None
        self.last_generated = 0

    @property
    def n_ctx(self) -> int:
        return self._context_settings.n_ctx

    def grow(self, n_ctx: int) -> None:
        """Recreate the context with room for `n_ctx` cells, keeping what the cache holds."""
        if n_ctx <= self.n_ctx:
            return
        state = self.ctx.state_bytes()
        self.ctx.close()
        self._context_settings = ContextSettings(
            n_ctx=n_ctx, n_batch=self._context_settings.n_batch, threads=self._context_settings.threads
        )
        self.ctx = LlamaContext(self.model, self._context_settings)
        self.ctx.load_state(state)

    def read(self, tokens: list[int], upto: int, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """Decode tokens [read_upto, upto) with progress over all `tokens`."""
        started = time.perf_counter()
        yield Progress(done=self.read_upto, total=len(tokens), elapsed_s=0.0)
        yield from prefill(self.ctx, tokens[self.read_upto : upto], self.read_upto, len(tokens), cancel)
        self.cells += upto - self.read_upto
        self.read_upto = upto
        self.read_s += time.perf_counter() - started

    def save(self) -> bytes | bytearray:
        """Remember (and return) the cache as it is now, to restore before each finish."""
        state = self.ctx.state_bytes()
        self._saved = (state, self.read_upto)
        return state

    def load(self, state: bytes | bytearray, n_tokens: int, cells: int | None = None, keep: bool = True) -> None:
        """Put a state of the first `n_tokens` prompt tokens (`cells` of them kept) in the cache.

        With `keep`, it also becomes what restore() returns to.
        """
        started = time.perf_counter()
        self.ctx.clear()
        self.ctx.load_state(state)
        self.read_upto = n_tokens
        self.cells = n_tokens if cells is None else cells
        if keep:
            self._saved = (state, n_tokens)
            self.read_s = time.perf_counter() - started

    def restore(self) -> None:
        if self._saved is None:
            raise RuntimeError("restore() without save()")
        self.ctx.clear()
        self.ctx.load_state(self._saved[0])
        self.read_upto = self.cells = self._saved[1]

    def keep_prefix(self, tokens: list[int], previous: list[int], generated: int) -> None:
        """Continue from the last prompt: drop the answer's cells and whatever of the previous
        prompt the new one does not share, so tokens[:read_upto] is what the cache holds."""
        shared = 0
        for new, old in zip(tokens, previous):
            if new != old:
                break
            shared += 1
        self.ctx.remove(0, shared, -1)
        self.cells -= generated + (len(previous) - shared)
        self.read_upto = shared

    def finish(
        self,
        tokens: list[int],
        settings: AskSettings,
        pins: np.ndarray | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """From a cache holding tokens[:read_upto]: the rest of the prompt, pruning, the answer.

        `pins` marks prompt positions kept on top of the budget (a conversation's earlier turns).
        """
        started = time.perf_counter()
        n_prompt = len(tokens)
        # The window never reaches back into what is already read (a saved document): the
        # question observes, up to `window` tokens of it.
        window_start = max(n_prompt - settings.policy.window, self.read_upto)
        if n_prompt - window_start < settings.policy.window:
            settings = replace(settings, policy=replace(settings.policy, window=n_prompt - window_start))
        yield from prefill(self.ctx, tokens[self.read_upto : window_start], self.read_upto, n_prompt, cancel)
        self.cells += max(window_start - self.read_upto, 0)
        if settings.prunes and n_prompt > settings.policy.budget:
            votes = observe(self.ctx, tokens[window_start:], window_start)
            window_s = time.perf_counter() - started
            pieces = self.model.pieces_text(tokens) if settings.policy.spans else None
            plan = plan_prune(settings.policy, votes, pieces, pins)
            _, compact_s = apply_plan(self.ctx, plan)
            self.cells = plan.n_kept
            yield pruned_event(plan, window_s, compact_s)
        else:
            self.ctx.decode(tokens[window_start:], window_start)
            self.cells += n_prompt - window_start
            window_s = time.perf_counter() - started
        kept = self.cells
        self.read_upto = n_prompt
        result = Generation()
        yield from self._generate(settings, n_prompt, result, cancel)
        self.cells += result.decoded
        self.last_generated = result.decoded
        yield Done(answer=result.text, stats=self._stats(settings, n_prompt, kept, result, window_s, started))

    def _generate(
        self, settings: AskSettings, next_pos: int, result: Generation, cancel: threading.Event | None
    ) -> Iterator[Event]:
        sampler = Sampler(settings.sampler)
        try:
            detokenizer = Detokenizer(self.model)
            yield from generate(
                self.ctx, sampler, detokenizer, next_pos, settings.max_tokens, result, cancel, settings.stop_at_end
            )
        finally:
            sampler.close()

    def _stats(
        self, settings: AskSettings, n_prompt: int, kept: int, result: Generation, window_s: float, started: float
    ) -> Stats:
        bytes_per_token = self.model.shape.kv_bytes_per_token()
        decoded = max(result.tokens - 1, 0)
        return Stats(
            model=self.model_name,
            method=settings.method,
            budget=settings.policy.budget,
            prompt_tokens=n_prompt,
            kept_tokens=kept,
            generated_tokens=result.tokens,
            kv_bytes_full=n_prompt * bytes_per_token,
            kv_bytes_kept=kept * bytes_per_token,
            prefill_tokens_per_s=n_prompt / max(self.read_s + window_s, 1e-9),
            decode_tokens_per_s=decoded / result.decode_s if result.decode_s > 0 else 0.0,
            ttft_s=self.read_s + (result.first_token_at - started),
            total_s=self.read_s + (time.perf_counter() - started),
            peak_cells=max(n_prompt, kept + result.tokens),
            stop_reason=result.stop_reason,
        )

    def close(self) -> None:
        self.ctx.close()

    def __enter__(self) -> "PromptRun":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
