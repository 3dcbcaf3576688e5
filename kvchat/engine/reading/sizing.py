"""How large a context a prompt needs, and how a document too long for the model is read."""

from __future__ import annotations

from dataclasses import replace

from kvchat.engine.settings import AskSettings
from kvchat.errors import PromptTooLongError
from kvchat.llama import LlamaModel
from kvchat.policy import Full, SnapStream, method_carrying, method_options

CTX_ROUNDING = 256
RING_MIN = 64  # the least room an answer needs besides the prompt
# A question beside a document may take at most this share of the model's trained context: the
# document is what the context is for, and a question that long is a document of its own.
QUESTION_SHARE = 4


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


def check_prompt(model: LlamaModel, settings: AskSettings, n_document: int, n_earlier: int, n_question: int) -> None:
    """Refuse a question about a document whose prompt does not fit, before any context is made
    or grown for it: the one check every front end's question passes (Conversation.select).

    `n_document`: the document's cells while the question is read (the whole document, or what a
    streamed reading holds); `n_earlier`: the earlier turns, pinned whole; `n_question`: the
    question's part of the prompt. The question alone may take at most 1/QUESTION_SHARE of the
    trained context; all of them, with the least room for an answer, the trained context; the
    cells kept for the answer at most `settings.kept_cells` (a server's sequence).
    """
    trained = model.shape.n_ctx_train
    most = trained // QUESTION_SHARE
    if n_question > most:
        raise PromptTooLongError(
            f"the question is {n_question:,} tokens; a question may take at most {most:,} "
            f"(a quarter of the {trained:,} the model was trained on)",
            "ask a shorter question: long text belongs in the document",
        )
    n_prompt = n_document + n_earlier + n_question
    if n_prompt + RING_MIN > trained:
        raise PromptTooLongError(
            f"the prompt is {n_prompt:,} tokens ({n_document:,} of the document, {n_earlier:,} of earlier turns, "
            f"{n_question:,} of the question); the model was trained on {trained:,}",
            "ask a shorter question, or start a new conversation",
        )
    method = settings.method
    kept = (min(n_document + n_question, method.budget) if method.scores else n_document + n_question) + n_earlier
    if settings.kept_cells is not None and kept > settings.kept_cells:
        raise PromptTooLongError(
            f"the prompt keeps {kept:,} tokens for its answer ({n_earlier:,} of them earlier turns); "
            f"a conversation holds {settings.kept_cells:,}",
            "start a new conversation, or send fewer earlier turns",
        )


def reading_settings(
    model: LlamaModel, n_document: int, settings: AskSettings, drafted: bool,
) -> tuple[AskSettings, str | None]:
    """The settings a document of `n_document` tokens is read with, and the notice when they are
    not the ones asked for. On a GPU, by default, a document that fits is answered from its whole
    cache (answers_whole_on_gpu). A document longer than the model's trained context is never read
    whole: where its questions read fast (`drafted`: with a draft's cheap pass), each reads the
    passages it chooses at consecutive positions, and its follow-ups load them from its passage
    bank (reads_whole()); otherwise it is read streamed (SnapStream with the method's budget and
    options) unless the method was named. A context size asked for (`n_ctx`) that is too small
    stays an error."""
    if answers_whole_on_gpu(model, n_document, settings):
        return replace(settings, method=Full(), read="full"), None
    if settings.method.streams or reads_whole(model, n_document):
        return settings, None
    too_long = f"the document is {n_document:,} tokens, more than the {model.shape.n_ctx_train:,} the model was trained on"
    if settings.reads_fast(drafted):
        consecutive = replace(settings, fast=replace(settings.fast, positions="consecutive"))
        return consecutive, f"{too_long}: each question reads the passages it chooses"
    if settings.method_named:
        return settings, None
    streamed = replace(settings, method=method_carrying(SnapStream.name, method_options(settings.method)), read="full")
    return streamed, f"{too_long}: reading it streamed (snapstream), keeping {streamed.method.budget:,} entries"


def answers_whole_on_gpu(model: LlamaModel, n_document: int, settings: AskSettings) -> bool:
    """Whether a document is read whole and answered from all of its cache because the model runs
    on a GPU: there reading it again is sooner than choosing what to keep (an H200 reads 24K tokens
    in 1.3 s; SnapKV's choice after it takes 2.3-3.1 s more, on the host) and the whole cache
    answered held-out questions best (docs/bench.md, "On a GPU"). Only where kvchat chooses (the
    defaults: `read` auto, no method named), the document fits the model's context, and the
    context holds it (not a server's sequence of `kept_cells`)."""
    return (settings.read == "auto" and not settings.method_named and settings.kept_cells is None
            and model.on_gpu and reads_whole(model, n_document))


def reads_whole(model: LlamaModel, n_document: int) -> bool:
    """Whether a document of `n_document` tokens can be read whole (and saved so): it fits the
    positions the model was trained on. One longer is read fast or streamed for each question,
    and its follow-ups' reading is its passage bank (ways/registry.py)."""
    return n_document <= model.shape.n_ctx_train
