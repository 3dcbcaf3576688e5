"""How large a context a prompt needs."""

from __future__ import annotations

from kvchat.engine.settings import AskSettings
from kvchat.errors import PromptTooLongError
from kvchat.llama import LlamaModel

CTX_ROUNDING = 256
RING_MIN = 64  # the least room an answer needs besides the prompt


def round_up(value: int, multiple: int = CTX_ROUNDING) -> int:
    return -(-value // multiple) * multiple


def context_size(model: LlamaModel, n_prompt: int, settings: AskSettings, reserve: int = 0) -> int:
    """The context an ask needs: the whole prompt while reading, then kept + answer (+ reserve).

    An answer longer than the context is fine (the decode ring evicts its oldest tokens); the
    prompt itself must fit while it is read.
    """
    kept = min(n_prompt, settings.method.budget) if settings.method.prunes else n_prompt
    wanted = max(n_prompt, kept + settings.max_tokens) + reserve
    if n_prompt > model.shape.n_ctx_train:
        raise PromptTooLongError(
            f"the prompt is {n_prompt:,} tokens; the model was trained on {model.shape.n_ctx_train:,}",
            "use --method snapstream, which reads documents of any length within the budget",
        )
    n_ctx = settings.n_ctx or min(round_up(wanted), max(model.shape.n_ctx_train, n_prompt + RING_MIN))
    if n_prompt + RING_MIN > n_ctx:
        raise PromptTooLongError(
            f"the prompt is {n_prompt:,} tokens; the context holds {n_ctx:,}",
            f"use --n-ctx {round_up(n_prompt + RING_MIN)} or more, or --method snapstream",
        )
    return n_ctx
