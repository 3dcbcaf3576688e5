"""A fast reading: the prompt's tokens a question chooses, read alone by the whole model, and the
last token's logits. The question's words choose (BM25 over the document's passages,
text/passages.py, with its opening passage where it names the document), or, where none of its
words is in the document or a choice by attention is asked for, a cheap pass's attention
(cheap_pass.py: the draft's first layers, or the model's own). The passages chosen are loaded from
the document's passage bank where one is read (passage_bank.py) instead of read again; the rest
of the prompt (earlier turns, the question) is read after them. Where the cheap pass chose more
than the budget, the question's window observes that reading and SnapKV keeps the budget's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import replace

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.cheap_pass import CheapPass, cheap_pass_votes, make_room, reread_tokens
from kvchat.engine.reading.passage_bank import PassageBank, load_passages_of
from kvchat.engine.reading.selected import Selected
from kvchat.engine.reading.sizing import RING_MIN
from kvchat.engine.settings import AskSettings
from kvchat.engine.text.passages import Passages, Question, names_the_document
from kvchat.events import Event, Progress


def fast_select(
    cache: KvCache, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None,
    cheap_pass: CheapPass = CheapPass(), question: Question | None = None, bank: PassageBank | None = None,
) -> Generator[Event, None, Selected]:
    """Into an empty `cache`: the kept prompt of `tokens` as a fast reading chooses it, and the
    last token's logits. Progress over the cheap pass (if any), then over the model's reading of
    the chosen tokens, then Pruned; returns the Selected. `cancel` stops either part-way through
    its batch. `question`: its text and the document's passages, for a choice by its words, and the
    earlier turns, read and kept whatever the method keeps; `bank`: those passages' reading
    (passage_bank.py), from which the chosen ones are loaded instead of read."""
    started = time.perf_counter()
    ctx, n_prompt = cache.ctx, len(tokens)
    reread = reread_tokens(settings, cheap_pass.drafted)
    window_start = max(n_prompt - settings.method.window, 0)  # the question's window observes from here
    if bank is not None and question is not None:
        window_start = max(window_start, question.start)  # a follow-up reads its question only: the rest is loaded
    yield Progress(done=0, total=n_prompt, elapsed_s=0.0)
    body, read = yield from _choose(cache, tokens, window_start, settings, reread, cheap_pass, question, cancel)
    make_room(cache, len(body) + n_prompt - window_start + settings.max_tokens)  # the answer may use the ring past that
    ctx = cache.ctx
    n_loaded = 0
    if bank is not None and question is not None:  # the chosen passages' reading is banked: loaded, not read
        loaded = load_passages_of(cache, bank, question.passages, body, tokens)
        body, n_loaded = np.setdiff1d(body, loaded), len(loaded)
        read += f", {n_loaded:,} loaded"
    yield from cache.prefill_chosen(tokens, body, window_start, cancel)  # the second pass; the question's window follows
    window = tokens[window_start:]
    compact_s = 0.0
    if reread > settings.method.budget and len(body) + len(window) > settings.method.budget:
        turns = _cells_of(body, question.earlier_turns) if question is not None and question.n_earlier else None
        compact_s = cache.keep_chosen_by(window, settings.method, turns)  # the question's attention over the re-reading keeps the budget's
        read += f", {len(body) + len(window):,} re-read"
    else:
        cache.decode(window, want_logits=True)
    if settings.fast_reading.positions == "original" and ctx.can_shift():
        cache.move_to(cache.origins)  # llama.cpp reads a batch only right after the last position
    window_s = time.perf_counter() - started - compact_s
    yield cache.pruned(n_prompt, window_s, compact_s)
    return Selected(n_prompt, cache.cells, n_loaded, 0.0, window_s, started, read=read)


def _choose(
    cache: KvCache, tokens: list[int], window_start: int, settings: AskSettings, reread: int, cheap_pass: CheapPass,
    question: Question | None, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, str]]:
    """The prompt's tokens before the question's window that the model reads (sorted), and how they
    were chosen: by a cheap pass's attention, or (bm25) by the question's words where it shares
    some with the document's passages, else by the cheap pass's attention over those passages.
    The earlier turns of a conversation are read whatever chooses. A prompt longer than the cheap
    pass's model was trained on is read by it in groups of passages (_attention_in_groups)."""
    fast = settings.fast_reading
    passages = question.passages if question is not None else None
    def most() -> int:  # what one cheap pass reads besides the window (its model loaded to know: not for the words' choice)
        return cheap_pass.trained(cache) - (len(tokens) - window_start) - RING_MIN

    if passages is None or not len(passages.starts) or (fast.choose == "attention" and window_start <= most()):
        origins, kept, _, layers = yield from cheap_pass_votes(cache, tokens, None, window_start, settings, reread, cheap_pass, cancel)
        turns = question.earlier_turns if question is not None else np.zeros(0, dtype=np.int64)
        return np.union1d(_before(origins[kept], window_start), _before(turns, window_start)), f"{cheap_pass.label} {layers} layers"
    if fast.choose != "attention":
        words = passages.bm25(question.text)
        if (words > 0).any():
            opening = fast.opening if fast.opening_for == "every" or names_the_document(question.text) else 0
            chosen = passages.top(words, reread, opening)
            return passages.tokens_of(chosen, window_start), f"bm25{' and the opening' if opening else ''}, {len(chosen)} passages"
    attention, layers = yield from _attention_in_groups(cache, tokens, window_start, settings, reread, cheap_pass, passages,
                                                        most(), cancel)
    chosen = passages.top(np.where(np.isfinite(attention), attention, -np.inf), reread, fast.opening)
    return passages.tokens_of(chosen, window_start), f"{cheap_pass.label} {layers} layers, {len(chosen)} passages"


def _attention_in_groups(
    cache: KvCache, tokens: list[int], window_start: int, settings: AskSettings, reread: int, cheap_pass: CheapPass,
    passages: Passages, most: int, cancel: threading.Event | None,
) -> Generator[Event, None, tuple[np.ndarray, str]]:
    """Each passage's score by the cheap pass's attention (Passages.attention) and the layers read:
    every passage read at once where the prompt fits `most` tokens, else in consecutive groups
    that each do, each read after the prompt's opening with the question's window observing (as
    a retrieval tool scores its chunks apart), their progress told as one reading's."""
    groups = _groups(passages, window_start, most)
    attention, layers, done = np.full(len(passages.starts), -np.inf), "", 0
    total = sum(len(group) for group in groups)
    for read in groups:
        run = cheap_pass_votes(cache, tokens, read, window_start, settings, reread, cheap_pass, cancel)
        origins, _, scores, layers = yield from _told_from(run, done, total)
        attention = np.maximum(attention, passages.attention(scores, origins[: len(scores)]))
        done += len(read)
    return attention, layers


def _groups(passages: Passages, window_start: int, most: int) -> list[np.ndarray]:
    """The prompt indices that read the document's passages (Passages.tokens_of) in consecutive
    groups of at most `most` tokens each (one passage at least); one group where all fit."""
    every = np.arange(len(passages.starts))
    opening = len(passages.tokens_of(every[:0], window_start))  # read with every group
    lengths = passages.lengths + (passages.mark_ends - passages.mark_starts)  # a page's mark counted with each of its passages
    groups: list[list[int]] = [[]]
    size = opening
    for index, length in enumerate(lengths.tolist()):
        if groups[-1] and size + length > most:
            groups.append([])
            size = opening
        groups[-1].append(index)
        size += length
    return [passages.tokens_of(np.asarray(group, dtype=np.int64), window_start) for group in groups]


def _told_from(
    run: Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]], done: int, total: int,
) -> Generator[Event, None, tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
    """`run`'s events, its Progress told as part of a reading of `total` tokens begun `done` tokens ago."""
    while True:
        try:
            event = next(run)
        except StopIteration as finished:
            return finished.value
        yield replace(event, done=done + event.done, total=total) if isinstance(event, Progress) else event


def _cells_of(body: np.ndarray, turns: np.ndarray) -> tuple[int, int]:
    """The [start, end) cells of the sorted `body` that hold the earlier `turns` (consecutive
    prompt indices; the question's window may hold their last ones instead)."""
    return int(np.searchsorted(body, turns[0])), int(np.searchsorted(body, turns[-1], side="right"))


def _before(indices: np.ndarray, window_start: int) -> np.ndarray:
    """The prompt indices a cheap pass kept, less the question's window (read after them)."""
    return indices[indices < window_start]
