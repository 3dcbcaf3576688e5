"""How large a context a prompt needs, and how a document too long for the model is read."""

from __future__ import annotations

from dataclasses import replace

from kvchat.engine.settings import AskSettings
from kvchat.errors import PromptTooLongError
from kvchat.llama import LlamaModel
from kvchat.policy import SnapStream, method_carrying, method_options

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
            "leave `method` out (or use snapstream): a long document is then read streamed, within the budget",
        )
    n_ctx = settings.n_ctx or min(round_up(wanted), max(model.shape.n_ctx_train, n_prompt + RING_MIN))
    if n_prompt + RING_MIN > n_ctx:
        raise PromptTooLongError(
            f"the prompt is {n_prompt:,} tokens; the context holds {n_ctx:,}",
            f"use `n_ctx` {round_up(n_prompt + RING_MIN)} or more, or `method` snapstream",
        )
    return n_ctx


def reading_settings(model: LlamaModel, n_document: int, settings: AskSettings) -> tuple[AskSettings, str | None]:
    """The settings a document of `n_document` tokens is read with, and the notice when they are
    not the ones asked for: a document longer than the model's trained context is read streamed
    (SnapStream with the method's budget and options) unless the method was named (`auto_stream`
    off). A context size asked for (`n_ctx`) that is too small stays an error."""
    if settings.method.streams or not settings.auto_stream or n_document <= model.shape.n_ctx_train:
        return settings, None
    streamed = replace(settings, method=method_carrying(SnapStream.name, method_options(settings.method)), read="full")
    notice = (
        f"the document is {n_document:,} tokens, more than the {model.shape.n_ctx_train:,} the model was trained on: "
        f"reading it streamed (snapstream), keeping {streamed.method.budget:,} entries"
    )
    return streamed, notice
