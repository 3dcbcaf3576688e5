"""Reading a prompt once and answering it: the one path `ask`, the bench and replays share."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from kvchat.errors import PromptTooLongError
from kvchat.events import Done, Event, Progress, Stats
from kvchat.llama import ContextSettings, Detokenizer, LlamaContext, LlamaModel, Sampler
from kvchat.engine.pipeline import Generation, apply_plan, generate, observe, plan_prune, prefill, pruned_event
from kvchat.engine.settings import AskSettings

CTX_ROUNDING = 256


def _round_up(value: int, multiple: int = CTX_ROUNDING) -> int:
    return -(-value // multiple) * multiple


def context_size(model: LlamaModel, n_prompt: int, settings: AskSettings) -> int:
    """The context an ask needs: the whole prompt while reading, then kept + answer."""
    kept = min(n_prompt, settings.policy.budget) if settings.prunes else n_prompt
    needed = max(n_prompt, kept + settings.max_tokens)
    if n_prompt > model.shape.n_ctx_train:
        raise PromptTooLongError(
            f"the prompt is {n_prompt} tokens; the model was trained on {model.shape.n_ctx_train}",
            "use a shorter document or a model with a longer context",
        )
    n_ctx = settings.n_ctx or min(_round_up(needed), max(model.shape.n_ctx_train, needed))
    if needed > n_ctx:
        raise PromptTooLongError(
            f"the prompt ({n_prompt} tokens) and the answer (--max-tokens {settings.max_tokens}) "
            f"need {needed} cells; the context has {n_ctx}",
            f"use --n-ctx {_round_up(needed)} or a smaller --max-tokens",
        )
    return n_ctx


class PromptRun:
    """One prompt on its own context: read a prefix once, then finish under some settings.

    `finish` may run again after `restore()`, so several settings can be compared on one read.
    """

    def __init__(self, model: LlamaModel, tokens: list[int], settings: AskSettings, model_name: str) -> None:
        self.model = model
        self.tokens = tokens
        self.model_name = model_name
        n_ctx = context_size(model, len(tokens), settings)
        self.ctx = LlamaContext(model, ContextSettings(n_ctx=n_ctx, n_batch=settings.n_batch, threads=settings.threads))
        self.read_upto = 0
        self.read_s = 0.0
        self._saved: bytes | None = None

    def read(self, upto: int, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """Decode prompt tokens [0, upto), with progress over the whole prompt."""
        started = time.perf_counter()
        yield Progress(done=0, total=len(self.tokens), elapsed_s=0.0)
        yield from prefill(self.ctx, self.tokens[:upto], 0, len(self.tokens), cancel)
        self.read_upto = upto
        self.read_s = time.perf_counter() - started

    def save(self) -> None:
        self._saved = self.ctx.state_bytes()

    def restore(self) -> None:
        if self._saved is None:
            raise RuntimeError("restore() without save()")
        self.ctx.clear()
        self.ctx.load_state(self._saved)

    def finish(self, settings: AskSettings, cancel: threading.Event | None = None) -> Iterator[Event]:
        """From a cache holding [0, read_upto): the rest of the prompt, pruning, the answer."""
        started = time.perf_counter()
        n_prompt = len(self.tokens)
        window_start = n_prompt - min(settings.policy.window, n_prompt)
        kept = n_prompt
        if self.read_upto < window_start:
            self.ctx.decode(self.tokens[self.read_upto : window_start], self.read_upto, want_logits=False)
        if settings.prunes and n_prompt > settings.policy.budget:
            votes = observe(self.ctx, self.tokens[window_start:], window_start)
            window_s = time.perf_counter() - started
            pieces = self.model.pieces_text(self.tokens) if settings.policy.spans else None
            plan = plan_prune(settings.policy, votes, pieces)
            _, compact_s = apply_plan(self.ctx, plan)
            kept = plan.n_kept
            yield pruned_event(plan, window_s, compact_s)
        else:
            self.ctx.decode(self.tokens[window_start:], window_start)
            window_s = time.perf_counter() - started
        result = Generation()
        sampler = Sampler(settings.sampler)
        try:
            detokenizer = Detokenizer(self.model)
            yield from generate(self.ctx, sampler, detokenizer, n_prompt, settings.max_tokens, result, cancel)
        finally:
            sampler.close()
        yield Done(answer=result.text, stats=self._stats(settings, kept, result, window_s, started))

    def _stats(self, settings: AskSettings, kept: int, result: Generation, window_s: float, started: float) -> Stats:
        n_prompt = len(self.tokens)
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


def ask_tokens(
    model: LlamaModel,
    tokens: list[int],
    settings: AskSettings,
    model_name: str,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Read `tokens` (a full chat prompt), prune per `settings`, and stream the answer."""
    with PromptRun(model, tokens, settings, model_name) as run:
        window_start = len(tokens) - min(settings.policy.window, len(tokens))
        yield from run.read(window_start, cancel)
        yield from run.finish(settings, cancel)
