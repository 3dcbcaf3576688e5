"""One question on one prompt: size the context, read, finish."""

from __future__ import annotations

from kvchat.engine.settings import AskSettings
from kvchat.errors import PromptTooLongError
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
