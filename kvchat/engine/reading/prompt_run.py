"""A prompt on its own llama.cpp context: read once, then select and answer many times.

`ask`, conversations, the server and the bench share this one path: bring a prefix of the prompt
into the cache (`open`: load the longest saved reading of it, read the rest, save the reading; or
`stream` it within a budget), then `select` decodes the rest, observes the question's attention, prunes and compacts, and returns what `answer` generates
from. `save()`/`restore()` let several questions or settings start from one reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvchat.engine.kvcache.cache import KvCache, SavedCells
from kvchat.engine.reading.passage_bank import PassageBank
from kvchat.engine.text.passages import Question
from kvchat.engine.reading.cheap_pass import CheapPass
from kvchat.engine.reading.fast_reading import fast_select
from kvchat.engine.reading.generate import Generation, answer_stats, generate
from kvchat.engine.reading.selected import Selected
from kvchat.engine.settings import AskSettings
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.reading.chunked import stream_read
from kvchat.errors import DecodeError
from kvchat.events import Done, Event, Notice, Progress, timed
from kvchat.llama import LlamaContext, LlamaModel, Sampler
from kvchat.policy import Method


class PromptRun:
    """Owns a context and its cache; prompt tokens [0, read_upto) are in it, the first
    `loaded_upto` of them from a saved state (a file, the restore point, a kept prefix) rather than
    decoded for the coming answer."""

    def __init__(
        self, model: LlamaModel, n_ctx: int, settings: AskSettings, model_name: str, cheap_pass: CheapPass = CheapPass(),
    ) -> None:
        """`cheap_pass`: who does a fast reading's cheap pass."""
        self.model = model
        self.cheap_pass = cheap_pass
        self.model_name = model_name
        self.cache = KvCache(LlamaContext(model, settings.layout.context(n_ctx, settings.n_batch, settings.threads)))
        self.read_upto = 0
        self.loaded_upto = 0
        self.read_s = 0.0
        self.holds_fast_answer = False  # the cache holds what a fast reading chose (read_fast()), not the prompt
        self._saved: tuple[SavedCells, int] | None = None  # and read_upto then
        self._at_saved = False  # the cache is exactly the saved state (restore() has nothing to do)
        self._aside: tuple[SavedCells, int] | None = None  # a whole reading stopped for a fast one, and its read_upto

    @property
    def n_ctx(self) -> int:
        return self.cache.ctx.settings.n_ctx  # a fast reading may have grown it (cheap_pass.make_room)

    def grow(self, n_ctx: int) -> None:
        """Recreate the context with room for `n_ctx` cells, keeping what the cache holds."""
        if n_ctx > self.n_ctx:
            self.cache.recreate(replace(self.cache.ctx.settings, n_ctx=n_ctx))

    def read(self, tokens: list[int], upto: int, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """Decode tokens [read_upto, upto) with progress over all `tokens`. Stopped midway (by
        `cancel`), the cache holds tokens[:read_upto], and the next read() goes on from there."""
        yield Progress(done=self.read_upto, total=len(tokens), elapsed_s=0.0, read_from=self.read_upto)
        counted_s = 0.0  # of the batches' reading time (KvCache.prefill: not a batch stopped part-way, nor a pause)
        for progress in self.cache.prefill(tokens[self.read_upto : upto], self.read_upto, len(tokens), cancel):
            self.read_upto = progress.done
            self._add_read_s(progress.elapsed_s - counted_s)
            counted_s = progress.elapsed_s
            yield progress

    def stream(
        self,
        tokens: list[int],
        question_window: list[int] | None,
        settings: AskSettings,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Read tokens[read_upto:] within the budget (streamed reading, see chunked.py)."""
        for event in timed(stream_read(self.cache, self.model, tokens, self.read_upto, question_window, settings, cancel),
                           self._add_read_s):
            if isinstance(event, Progress):
                self.read_upto = event.done
            yield event

    def _add_read_s(self, seconds: float) -> None:
        """read_s is reading time only, not a pause between two batches (a whole reading's from its
        Progress, a streamed one's from events.timed)."""
        self.read_s += seconds

    def keep_once(self, window: list[int], method: Method) -> None:
        """A choice made once, before any question: `window` observes without staying, `method`
        keeps what its votes choose (the document's last token stands in the window), and the
        kept cells become the restore point."""
        votes = self.cache.observe(window, keep=False)
        self.cache.apply(self.cache.plan(method, 1, votes))
        self.save()

    def save(self) -> bytes:
        """Make the cache as it is now the restore point (and return its state)."""
        saved = self.cache.saved()
        self._saved = (saved, self.read_upto)
        self._at_saved = True
        return saved.state

    def open(
        self,
        tokens: list[int],
        upto: int,
        states: DocumentStates | None,
        label: str,
        cancel: threading.Event | None = None,
        min_saved: int = 1,
        restore_point: bool = True,
    ) -> Iterator[Event]:
        """Bring tokens[:upto] into the cache: load the longest saved reading of a prefix of them
        from `states`, decode the rest, and save the reading under `label` when at least
        `min_saved` tokens of it were new. With `restore_point` it is what restore() returns to
        (a prompt answered once leaves it off: copying a long state has its cost)."""
        if states is not None and self.read_upto == 0:  # else the cache holds a reading to go on with
            yield from self._load_longest(states, tokens[:upto], label)
        if self.read_upto == upto and self._at_saved:
            return  # all of it was loaded, and is the restore point already
        yield from self.read(tokens, upto, cancel)
        new_reading = states is not None and upto - self.loaded_upto >= min_saved
        if restore_point or new_reading:
            state = self.save()
        if new_reading:
            yield from states.save(tokens[:upto], state, label)

    def _load_longest(self, states: DocumentStates, tokens: list[int], label: str) -> Iterator[Event]:
        """Load the longest saved reading of a prefix of `tokens`: loaded_upto says how long.

        A reading llama.cpp refuses (its checksum is sound, its shape is not) is deleted like a
        damaged one, and the cache emptied, so the tokens are read again and saved anew.
        """
        started = time.perf_counter()
        for length in _candidate_lengths(states, len(tokens)):
            found = yield from states.load(tokens[:length])
            if found is None:
                continue
            positions = np.arange(length, dtype=np.int64)
            try:
                self.cache.load(found, positions, np.asarray(tokens[:length], dtype=np.int64))
            except DecodeError:
                self.cache.clear()  # a refusal midway can leave part of the state in the cells
                yield from states.discard(tokens[:length], "llama.cpp refused it")
                continue
            self.read_upto = self.loaded_upto = length
            self._saved = (SavedCells(found, self.cache.positions, self.cache.tokens, self.cache.origins), length)
            self._at_saved = True
            self.read_s += time.perf_counter() - started
            name = Path(label).name
            if length == len(tokens):
                yield Notice(f"loaded the saved reading of {name} ({length:,} tokens)")
            else:  # another prompt's reading, of the same beginning
                yield Notice(f"loaded a saved reading of the first {length:,} of {len(tokens):,} tokens of {name}")
            return

    def restore(self) -> None:
        """Back to the restore point save() (or open(), or a loaded reading) set."""
        if self._at_saved:
            return
        if self._saved is None:
            raise RuntimeError("restore() without save()")
        saved, read_upto = self._saved
        self.cache.restore(saved)
        self.read_upto = self.loaded_upto = read_upto
        self._at_saved = True

    def keep_prefix(self, tokens: list[int], previous: list[int]) -> None:
        """Continue from the last prompt: drop the answer's cells and whatever of the previous
        prompt the new one does not share, so the cache holds what tokens[:read_upto] left."""
        shared = 0
        for new, old in zip(tokens, previous):
            if new != old:
                break
            shared += 1
        self.cache.keep_prefix(shared)
        self.read_upto = self.loaded_upto = shared
        self._at_saved = False

    def clear(self) -> None:
        """Empty the cache and forget the restore point."""
        self.cache.clear()
        self.read_upto = self.loaded_upto = 0
        self._saved, self._at_saved, self._aside = None, False, None
        self.holds_fast_answer = False

    def read_fast(
        self, tokens: list[int], settings: AskSettings, cancel: threading.Event | None = None, question: Question | None = None,
        bank: PassageBank | None = None,
    ) -> Iterator[Event]:
        """Instead of reading and select(): a fast reading of the whole prompt (fast_reading.py) into the
        emptied cache; `question` for a choice by its words, `bank` where its passages' reading is banked. What a whole reading stopped midway had
        read is set aside (back_to_reading()). Returns the Selected that answer() takes."""
        aside = self._aside if self.holds_fast_answer or not self.read_upto else (self.cache.saved(), self.read_upto)
        self.clear()
        self._aside = aside
        self.holds_fast_answer = True  # from here on, even if it is stopped: back_to_reading() takes the reading back
        selected = yield from fast_select(self.cache, tokens, settings, cancel, self.cheap_pass, question, bank)
        self.read_upto = len(tokens)
        return selected

    @property
    def whole_read_upto(self) -> int:
        """How far the whole reading has got: while the cache holds a fast answer, what is set
        aside for it."""
        if not self.holds_fast_answer:
            return self.read_upto
        return self._aside[1] if self._aside is not None else 0

    def back_to_reading(self) -> None:
        """After a fast answer: the cache holds again what the whole reading had read before it
        (nothing, if none had begun), for the reading to go on from there."""
        aside = self._aside
        self.clear()
        if aside is not None:
            saved, self.read_upto = aside
            self.cache.restore(saved)

    def select(
        self,
        tokens: list[int],
        settings: AskSettings,
        n_pinned: int = 0,
        cancel: threading.Event | None = None,
        prune: bool = True,
        reading_s: float | None = None,
        first: np.ndarray | None = None,
    ) -> Iterator[Event]:
        """From a cache holding tokens[:read_upto]: the rest of the prompt, observation and
        pruning (unless `prune` is off: the cache holds an earlier selection); the cache then
        holds the kept prompt and the last token's logits.

        The first `n_pinned` tokens after read_upto (a conversation's earlier turns) are kept on
        top of the budget; the prompt tokens `first` (the passages the question's words choose) are
        kept within it before the votes choose. The observation window never reaches back into
        what was already read: the question observes, up to `window` tokens of it. Returns the Selected that answer()
        takes; `reading_s` is the reading its TTFT counts (default: this run's reading time).
        """
        started = time.perf_counter()
        self._at_saved = False
        n_prompt = len(tokens)
        method = settings.method
        window_start = max(n_prompt - method.window, self.read_upto)
        window = n_prompt - window_start
        pin_start = self.cache.cells
        yield from self.cache.prefill(tokens[self.read_upto : window_start], self.read_upto, n_prompt, cancel)
        if prune and method.scores and self.cache.cells + window > method.budget:
            compact_s = self.cache.keep_chosen_by(tokens[window_start:], method, (pin_start, pin_start + n_pinned), first)
            window_s = time.perf_counter() - started - compact_s
            yield self.cache.pruned(n_prompt, window_s, compact_s)
        else:
            self.cache.decode(tokens[window_start:], want_logits=True)
            window_s = time.perf_counter() - started
        self.read_upto = n_prompt
        reading_s = self.read_s if reading_s is None else reading_s
        return Selected(n_prompt, self.cache.cells, min(self.loaded_upto, n_prompt), reading_s, window_s, started)

    def answer(self, settings: AskSettings, selected: Selected, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Generate from the logits select() left; Token events, then Done."""
        generation = Generation(self.model, settings.max_tokens)
        sampler = Sampler(settings.sampler)
        try:
            yield from generate(self.cache, sampler, generation, cancel)
        finally:
            sampler.close()
        began = selected.started - selected.reading_s
        stats = answer_stats(self.model, self.model_name, settings, selected, generation, began, self.cache.peak_cells)
        yield Done(answer=generation.text, stats=stats)

    def close(self) -> None:
        self.cache.ctx.close()

    def __enter__(self) -> "PromptRun":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _candidate_lengths(states: DocumentStates, n_tokens: int) -> Iterator[int]:
    """Prefix lengths to look up, longest first. The whole prefix comes first and alone: a
    document's own reading is found without listing the store, and a damaged file of it (no
    readable header, so never listed) is found, reported and deleted."""
    yield n_tokens
    yield from (length for length in states.saved_lengths(n_tokens) if length != n_tokens)
