"""The document cut into passages of whole sentences, and which of them a question chooses: by its
words (BM25, as retrieval tools choose their chunks), or by the attention of a cheap pass. A
question-chosen reading (reading/fast_reading.py) reads the chosen passages alone,
in document order.

Passages are cut on the sentence spans of policy/spans.py into runs of about PASSAGE_TOKENS
tokens, as LM Studio and AnythingLLM cut theirs (~1,000 characters); BM25 is bm25s's (Lucene's
scoring, English stop words removed, Snowball stems), over the passages' own text.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType

import numpy as np
import Stemmer

from kvchat.policy.spans import spans_from_pieces


def _without_jax(name: str) -> ModuleType:
    """Import `name` as if JAX were not installed, unless the program already imported JAX.
    bm25s imports JAX where it finds it and runs a top-k with it at once: JAX then starts on the
    GPU and takes most of its memory (XLA preallocates 75 %), and on an H200 llama.cpp could no
    longer load the draft model. kvchat uses bm25s's numpy scores only."""
    if "jax" in sys.modules:
        return importlib.import_module(name)
    sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax.lax` raises ImportError, as bm25s expects
    try:
        return importlib.import_module(name)
    finally:
        del sys.modules["jax"]


bm25s = _without_jax("bm25s")
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG: a line per index built

PASSAGE_TOKENS = 250  # a passage grows by whole sentences (of at most 48 tokens) up to this many tokens
_STEMMER = Stemmer.Stemmer("english")
# A question that names the document itself, in English as BM25's stop words and stems are.
_NAMES_THE_DOCUMENT = re.compile(r"\b(?:this|the)\s+(?:agreement|contract|document|paper|report|article|text|book)s?\b",
                                 re.IGNORECASE)


@dataclass(frozen=True)
class Passages:
    """A document prompt's passages: passage i is the prompt's tokens [starts[i], ends[i]) and
    reads `texts[i]`; it is read after its page's mark, the tokens [mark_starts[i], mark_ends[i])
    (an empty range where the document has no pages: prompt_text.py). `always` are the prompt's
    tokens outside the document's text (the chat template, the system prompt), read whatever the
    question chooses."""

    starts: np.ndarray
    ends: np.ndarray
    texts: tuple[str, ...]
    always: np.ndarray
    n_tokens: int  # the document prompt's
    mark_starts: np.ndarray
    mark_ends: np.ndarray

    @classmethod
    def cut(cls, pieces: list[str], in_text: np.ndarray, marks: np.ndarray | None = None) -> Passages:
        """The passages of a prompt whose tokens read `pieces`; `in_text` marks the tokens of the
        document's text (the others are `always`), `marks` those of its pages' marks. A passage
        holds whole sentences of one page."""
        marks = np.zeros(len(pieces), dtype=bool) if marks is None else marks
        inside = np.flatnonzero(in_text | marks)
        first, last = (int(inside[0]), int(inside[-1]) + 1) if len(inside) else (0, 0)
        sentence_ids = spans_from_pieces(pieces[first:last], "sentences")
        changes = (np.diff(sentence_ids, prepend=-1) != 0) | (np.diff(marks[first:last].astype(np.int8), prepend=-1) != 0)
        bounds = (np.flatnonzero(changes) + first).tolist() + [last]
        runs: list[list[int]] = []  # [start, end, mark_start, mark_end] of each passage
        mark = [first, first]
        for start, end in zip(bounds[:-1], bounds[1:]):
            if marks[start]:  # a page's mark (its sentences' cuts aside): the passages after it are its page's
                mark = [mark[0] if mark[1] == start and mark[1] > mark[0] else start, end]
            elif runs and runs[-1][2:] == mark and end - runs[-1][0] <= PASSAGE_TOKENS:
                runs[-1][1] = end  # the sentence joins the passage it fits in
            else:
                runs.append([start, end, *mark])
        starts, ends, mark_starts, mark_ends = np.asarray(runs, dtype=np.int64).reshape(-1, 4).T
        texts = tuple("".join(pieces[start:end]) for start, end in zip(starts.tolist(), ends.tolist()))
        always = np.concatenate([np.arange(first), np.arange(last, len(pieces))]).astype(np.int64)
        return cls(starts, ends, texts, always, len(pieces), mark_starts, mark_ends)

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    @cached_property
    def _index(self) -> bm25s.BM25 | None:
        """The passages' BM25 index; None where they hold no word it can index (punctuation,
        numbers or emoji alone, stop words alone), which bm25s cannot build."""
        words = _words(self.texts)
        if not any(words):
            return None
        index = bm25s.BM25()
        index.index(words, show_progress=False)
        return index

    def bm25(self, question: str) -> np.ndarray:
        """Each passage's BM25 score for `question`; all 0 when it shares no word with them."""
        if self._index is None:
            return np.zeros(len(self.texts))
        (words,) = _words([question])
        known = [word for word in words if word in self._index.vocab_dict]
        if not known:
            return np.zeros(len(self.texts))
        return np.asarray(self._index.get_scores(known), dtype=np.float64)

    def attention(self, token_scores: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """Each passage's mean score over its tokens that a cheap pass read (`token_scores[i]` is
        the score of prompt token `origins[i]`); -inf for a passage it did not read."""
        passage_of = np.searchsorted(self.ends, origins, side="right")
        inside = (passage_of < len(self.starts)) & (origins >= self.starts[np.minimum(passage_of, len(self.starts) - 1)])
        totals = np.bincount(passage_of[inside], weights=token_scores[inside], minlength=len(self.starts))
        counts = np.bincount(passage_of[inside], minlength=len(self.starts))
        return np.where(counts > 0, totals / np.maximum(counts, 1), -np.inf)

    def top(self, scores: np.ndarray, tokens: int, opening: int = 0) -> np.ndarray:
        """The document's first `opening` passages, then the best-scored ones (finite scores only)
        while their tokens add up to at most `tokens`, taken in order of score (ties: the earlier
        passage); at least one. Sorted."""
        first = list(range(min(opening, len(self.starts))))
        order = first + [index for index in np.argsort(-scores, kind="stable").tolist()
                         if np.isfinite(scores[index]) and index not in first]
        chosen, total = [], 0
        for index in order:
            if total + int(self.lengths[index]) <= tokens or not chosen:
                chosen.append(index)
                total += int(self.lengths[index])
        return np.sort(np.asarray(chosen, dtype=np.int64))

    def chosen_by_words(self, question: str, tokens: int) -> np.ndarray:
        """The prompt tokens of the passages `question`'s words choose (BM25), with their pages'
        marks, at most `tokens` of them; none where it shares no word with the document."""
        scores = self.bm25(question) if tokens > 0 else np.zeros(0)
        if not np.any(scores > 0):
            return np.zeros(0, dtype=np.int64)
        chosen = self.top(np.where(scores > 0, scores, -np.inf), tokens)
        read = self.tokens_of(chosen, self.n_tokens)
        return np.setdiff1d(read, self.always)[:tokens]

    def tokens_of(self, chosen: np.ndarray, upto: int) -> np.ndarray:
        """The indices of the tokens read of a prompt that begins with the document's and whose
        question's window starts at `upto`: the `chosen` passages' with their pages' marks and the
        `always` ones, then every token after the document's up to `upto` (earlier turns, the
        question's start); sorted."""
        runs = [np.arange(self.starts[index], self.ends[index]) for index in chosen.tolist()]
        marks = [np.arange(self.mark_starts[index], self.mark_ends[index]) for index in chosen.tolist()]
        read = np.concatenate([self.always, *marks, *runs, np.arange(self.n_tokens, upto)]).astype(np.int64)
        return np.unique(read[read < upto])  # sorted, a page's mark once


@dataclass(frozen=True)
class Question:
    """What a question-chosen reading needs of the question: its text, the passages of the
    document it is about, and how many tokens of earlier turns come between the document's and the
    question's in the prompt (a follow-up's: read and kept whatever chooses)."""

    text: str
    passages: Passages
    n_earlier: int = 0

    @property
    def start(self) -> int:
        """The prompt index where the question's own part begins (after the document's and the earlier turns')."""
        return self.passages.n_tokens + self.n_earlier

    @property
    def earlier_turns(self) -> np.ndarray:
        """The prompt indices of the earlier turns' tokens."""
        start = self.passages.n_tokens
        return np.arange(start, start + self.n_earlier, dtype=np.int64)


def names_the_document(question: str) -> bool:
    """Whether `question` names the document it is about ("this agreement", "the contract", "this
    paper"): it may ask what the document's opening says of it (its title, parties, date) in words
    the opening does not share ("When did the parties sign this contract?" of a preamble's "made
    March 14, 2011"). A question about a fact in it ("who plays Jennifer") is read from the passages
    its words choose alone: an encyclopedia article's opening names its lead, not the answer."""
    return _NAMES_THE_DOCUMENT.search(question) is not None


def _words(texts: list[str] | tuple[str, ...]) -> list[list[str]]:
    """Each text as BM25 reads it: lower-cased words, English stop words out, stemmed."""
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=_STEMMER, return_ids=False, show_progress=False)
