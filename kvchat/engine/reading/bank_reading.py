"""A conversation's passage bank (passage_bank.py): read (going on from where a stop left it, under
its reading's lock where it is saved), saved, loaded by a later process, and discarded where a
piece of it proves damaged."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator

from kvchat.engine.kvcache.in_progress import ReadingsInProgress, WholeReadingDone, read_alone
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.reading.passage_bank import BANK, HELD_AS, BankPieces, PassageBank, read_bank, save_bank, saved_bank
from kvchat.engine.text.passages import Passages
from kvchat.engine.reading.speeds import PASSAGES_SPEED, ReadingSpeeds
from kvchat.engine.settings import AskSettings
from kvchat.events import Event
from kvchat.llama import LlamaModel


class BankReading:
    """The passage bank of one document prompt (`tokens`, its `passages`), read with `settings`."""

    def __init__(
        self, model: LlamaModel, settings: AskSettings, tokens: list[int], passages: Passages, label: str,
        states: DocumentStates | None, speeds: ReadingSpeeds | None,
    ) -> None:
        """`label`: the document's path, as `kvchat cache list` names its bank; `speeds`: where its
        reading speed is remembered (`kvchat inspect`)."""
        self.model = model
        self.settings = settings
        self.tokens = tokens
        self.passages = passages
        self.label = label
        self.states = states
        self.speeds = speeds
        self.bank: PassageBank | None = None  # read here, or loaded (loaded())
        self._pieces = BankPieces()  # what read() read before it was stopped

    @property
    def key(self) -> str | None:
        """What the bank is saved as; None without a store."""
        return self.states.key_of(self.tokens, BANK) if self.states is not None else None

    @property
    def saved(self) -> bool:
        """Whether the bank is saved, here or by another process."""
        return self.states is not None and self.states.has(self.tokens, BANK)

    @property
    def ready(self) -> bool:
        """Whether a question can load the bank: read here, or saved."""
        return self.bank is not None or self.saved

    def read_alone(
        self, in_progress: ReadingsInProgress | None, claimant: tuple[str, str, str, int] | None,
        cancel: threading.Event | None, *, in_turn: bool = False, stoppable: bool = False,
    ) -> Generator[Event, None, WholeReadingDone]:
        """read() unless the bank is saved, holding its reading's lock (in_progress.read_alone) as
        the document's whole reading `claimant` would; without a store, read for this process only."""
        key = self.key
        if claimant is None or key is None or in_progress is None:
            yield from self.read(cancel)
            return WholeReadingDone.UNSAVED
        how = yield from read_alone(in_progress, (key, f"{claimant[1]} (passages)", *claimant[2:]), lambda: self.saved,
                                    lambda: self.read(cancel), cancel, in_turn=in_turn, stoppable=stoppable)
        return WholeReadingDone.UNSAVED if how is WholeReadingDone.READ and not self.saved else how

    def read(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Read the bank (from where a stop left it), pack it as HELD_AS, hold it and save it."""
        context = self.settings.layout.context(0, self.settings.n_batch, self.settings.threads)  # read_bank sizes it
        reading = read_bank(self.model, context, self.tokens, self.passages, cancel, self._pieces)
        from_start, reading_s = self._pieces.opening is None, 0.0  # the time spent reading, not paused for a question
        bank = None
        while bank is None:
            started = time.perf_counter()
            try:
                event = next(reading)
            except StopIteration as read:
                bank = read.value
                continue
            finally:
                reading_s += time.perf_counter() - started
            yield event
        self.bank, self._pieces = bank.packed_as(*HELD_AS), BankPieces()
        if self.speeds is not None and from_start:
            self.speeds.record(PASSAGES_SPEED, len(self.tokens), reading_s)
        yield from save_bank(self.states, self.tokens, self.bank, self.label)

    def loaded(self) -> Generator[Event, None, PassageBank | None]:
        """The bank read here or saved by an earlier process; None where there is none."""
        if self.bank is None:
            self.bank = yield from saved_bank(self.states, self.tokens)
        return self.bank

    def discard(self, reason: str) -> Iterator[Event]:
        """Forget the bank and delete it from the store (a piece of it proved damaged)."""
        self.bank = None
        if self.states is not None:
            yield from self.states.discard(self.tokens, reason, BANK)
