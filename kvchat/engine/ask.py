"""One question on one prompt: size the context, read, finish."""

from __future__ import annotations

from collections.abc import Iterator

from kvchat.engine.run import PromptRun
from kvchat.engine.settings import AskSettings
from kvchat.errors import PromptTooLongError
from kvchat.events import Event
from kvchat.llama import LlamaModel

CTX_ROUNDING = 256


def round_up(value: int, multiple: int = CTX_ROUNDING) -> int:
    return -(-value // multiple) * multiple


def context_size(model: LlamaModel, n_prompt: int, settings: AskSettings, reserve: int = 0) -> int:
    """The context an ask needs: the whole prompt while reading, then kept + answer (+ reserve)."""
    kept = min(n_prompt, settings.policy.budget) if settings.prunes else n_prompt
    needed = max(n_prompt, kept + settings.max_tokens) + reserve
    if n_prompt > model.shape.n_ctx_train:
        raise PromptTooLongError(
            f"the prompt is {n_prompt} tokens; the model was trained on {model.shape.n_ctx_train}",
            "use a shorter document or a model with a longer context",
        )
    n_ctx = settings.n_ctx or min(round_up(needed), max(model.shape.n_ctx_train, needed))
    if needed > n_ctx:
        raise PromptTooLongError(
            f"the prompt ({n_prompt} tokens) and the answer (--max-tokens {settings.max_tokens}) "
            f"need {needed} cells; the context has {n_ctx}",
            f"use --n-ctx {round_up(needed)} or a smaller --max-tokens",
        )
    return n_ctx


def replay(
    model: LlamaModel, tokens: list[int], variants: list[AskSettings], model_name: str = ""
) -> Iterator[list[Event]]:
    """Read `tokens` once, then answer under each settings from a restored copy of that read.

    The variants differ only in what they keep and generate: the fair comparison the bench
    and the tests make (same prompt, same process, same read).
    """
    window = min(max(s.policy.window for s in variants), len(tokens))
    n_ctx = max(context_size(model, len(tokens), s) for s in variants)
    with PromptRun(model, n_ctx, variants[0], model_name) as run:
        for _ in run.read(tokens, len(tokens) - window):
            pass
        run.save()
        for settings in variants:
            run.restore()
            yield list(run.finish(tokens, settings))
