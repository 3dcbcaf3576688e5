"""One question about one document, start to finish, as a stream of events."""

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
    """The context the ask needs: the whole prompt while reading, then kept + answer."""
    kept = min(n_prompt, settings.policy.budget) if settings.prunes else n_prompt
    needed = max(n_prompt, kept + settings.max_tokens)
    n_ctx = settings.n_ctx or min(_round_up(needed), max(model.shape.n_ctx_train, needed))
    if n_prompt > model.shape.n_ctx_train:
        raise PromptTooLongError(
            f"the prompt is {n_prompt} tokens; the model was trained on {model.shape.n_ctx_train}",
            "use a shorter document or a model with a longer context",
        )
    if needed > n_ctx:
        raise PromptTooLongError(
            f"the prompt ({n_prompt} tokens) and the answer (--max-tokens {settings.max_tokens}) "
            f"need {needed} cells; the context has {n_ctx}",
            f"use --n-ctx {_round_up(needed)} or a smaller --max-tokens",
        )
    return n_ctx


def ask_tokens(
    model: LlamaModel,
    tokens: list[int],
    settings: AskSettings,
    model_name: str,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Read `tokens` (a full chat prompt), prune per `settings`, and stream the answer."""
    started = time.perf_counter()
    n_prompt = len(tokens)
    window = min(settings.policy.window, n_prompt)
    n_ctx = context_size(model, n_prompt, settings)
    context_settings = ContextSettings(n_ctx=n_ctx, n_batch=settings.n_batch, threads=settings.threads)
    yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
    with LlamaContext(model, context_settings) as ctx:
        sampler = Sampler(settings.sampler)
        try:
            yield from prefill(ctx, tokens[: n_prompt - window], 0, n_prompt, cancel)
            prefix_done = time.perf_counter()
            kept = n_prompt
            if settings.prunes and n_prompt > settings.policy.budget:
                votes = observe(ctx, tokens[n_prompt - window :], n_prompt - window)
                read_s = time.perf_counter() - started
                pieces = model.pieces_text(tokens) if settings.policy.spans else None
                plan = plan_prune(settings.policy, votes, pieces)
                _, compact_s = apply_plan(ctx, plan)
                kept = plan.n_kept
                yield pruned_event(plan, started + read_s - prefix_done, compact_s)
            else:
                ctx.decode(tokens[n_prompt - window :], n_prompt - window)
                read_s = time.perf_counter() - started
            result = Generation()
            detokenizer = Detokenizer(model)
            yield from generate(ctx, sampler, detokenizer, n_prompt, settings.max_tokens, result, cancel)
        finally:
            sampler.close()
    total_s = time.perf_counter() - started
    bytes_per_token = model.shape.kv_bytes_per_token()
    decoded = max(result.tokens - 1, 0)
    stats = Stats(
        model=model_name,
        method=settings.method,
        budget=settings.policy.budget,
        prompt_tokens=n_prompt,
        kept_tokens=kept,
        generated_tokens=result.tokens,
        kv_bytes_full=n_prompt * bytes_per_token,
        kv_bytes_kept=kept * bytes_per_token,
        prefill_tokens_per_s=n_prompt / max(read_s, 1e-9),
        decode_tokens_per_s=decoded / result.decode_s if result.decode_s > 0 else 0.0,
        ttft_s=result.first_token_at - started,
        total_s=total_s,
        peak_cells=max(n_prompt, kept + result.tokens),
        stop_reason=result.stop_reason,
    )
    yield Done(answer=result.text, stats=stats)

