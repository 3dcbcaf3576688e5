"""What a conversation reads after its first answer, for the questions after it (its later
reading, Reading.later): the document's passage bank, or the rest of its whole reading; read in
the background by the front end (read_on()), or by a question that waits for it. Where the reading
is saved, one process reads it at a time (in_progress.read_alone): another's is awaited and loaded.

A part of Conversation (conversation.py), kept apart for its size: it holds none of its own state,
and uses the conversation's named below and its _read() (the document read whole or streamed, or
its saved reading loaded)."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator

from kvchat.documents import Document
from kvchat.engine.kvcache.in_progress import ReadingsInProgress, WholeReadingDone, read_alone
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.reading.bank_reading import BankReading
from kvchat.engine.reading.passage_bank import PassageBank
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.reading import Reading
from kvchat.events import Event, LaterReading


class LaterReadings:
    """The later reading of a Conversation, and its saved readings' keys."""

    document: Document
    model_name: str
    document_tokens: list[int]
    states: DocumentStates | None  # None: nothing is saved
    reading: Reading  # its way of reading, whose `later` says what is read after a fast answer
    run: PromptRun
    in_progress: ReadingsInProgress | None
    _bank: BankReading
    _unread: bool  # a fast reading answered; the later reading is not done

    @property
    def reading_key(self) -> str | None:
        """What the document's whole reading is saved as; None when it is not saved (no store, or
        a streamed reading)."""
        return self.states.key_of(self.document_tokens) if self.states is not None else None

    @property
    def claimant(self) -> tuple[str, str, str, int] | None:
        """(reading key, document, model, tokens): who reads the whole document (read_alone)."""
        key = self.reading_key
        return None if key is None else (key, str(self.document.path), self.model_name, len(self.document_tokens))

    @property
    def saved(self) -> bool:
        """Whether the document's whole reading is saved (open() will load it)."""
        return self.states is not None and self.states.has(self.document_tokens)

    @property
    def unread(self) -> bool:
        """The document is still to be read for the questions after (read_on()): only a fast
        reading answered; never where every question reads fast (retrieval)."""
        later = self.reading.later
        return self._unread and later is not None and not (later is LaterReading.PASSAGES and self._bank.ready)

    @property
    def later_key(self) -> str | None:
        """What the document's later reading (read_on()) is saved as; None when it is not saved."""
        return self._bank.key if self.reading.later is LaterReading.PASSAGES else self.reading_key

    @property
    def later_saved(self) -> bool:
        """Whether the document's later reading (read_on()) is saved, here or by another process."""
        return self.bank_saved if self.reading.later is LaterReading.PASSAGES else self.saved

    @property
    def bank_saved(self) -> bool:
        """Whether the document's passage bank is saved (read_bank()), here or by another process."""
        return self._bank.saved

    @property
    def bank(self) -> PassageBank | None:
        """The passage bank read_bank() read, or a question loaded; None before."""
        return self._bank.bank

    def read_on(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """After a fast answer, read the whole document (and save it): the questions after it are
        selected from that reading. The chat and the server run it in the background; stopped by
        `cancel`, it goes on from where it stopped at the next call, or for a question that waits
        for it because the rest is sooner than a fast reading (select()). While another
        process reads the document, its reading is awaited and loaded (in_progress.read_alone).
        Nothing where every question reads fast (retrieval). Read as its passages (the default,
        LaterReading), the document's passage bank is read instead and saved (read_passages()):
        no question waits for it, and those after it load the passages they choose."""
        if not self.unread:
            return
        if self.reading.later is LaterReading.PASSAGES:
            yield from self.read_passages(cancel)
        else:
            yield from self._read_rest(cancel)

    def _read_rest(self, cancel: threading.Event | None) -> Iterator[Event]:
        """The rest of the whole reading (read_on()), for the front end's background or a question that waits."""
        if not self._unread:
            return
        if self.run.holds_fast_answer:
            self.run.back_to_reading()  # it goes on from where it stopped for the fast answer, if it had begun
        yield from self._read_alone(cancel)
        self._unread = False

    def _read_alone(self, cancel: threading.Event | None, question: str | None = None, awaits_own: bool = True) -> Iterator[Event]:
        """Read the document whole the conversation's way, holding its reading's lock where the
        reading is saved: while another process reads it (a background reading, or another
        question's: two `kvchat ask` about one new document), that reading is awaited and loaded
        rather than the document read twice at once (in_progress.read_alone). `awaits_own` False
        (open()): this process's own reading of it is not awaited (read_alone)."""
        claimant = self.claimant
        if self.in_progress is None or claimant is None or self.saved:
            yield from self._read(cancel, question)  # not saved (streamed, `cache` off), or loaded
            return
        how = yield from read_alone(self.in_progress, claimant, lambda: self.saved, lambda: self._read(cancel, question), cancel,
                                    awaits_own=awaits_own)
        if how is WholeReadingDone.SAVED:
            yield from self._read(cancel, question)  # another process's reading: loaded

    def read_passages(self, cancel: threading.Event | None = None, *, in_turn: bool = False,
                      stoppable: bool = False) -> Generator[Event, None, WholeReadingDone]:
        """Read the document's passage bank and save it, unless it is saved (Engine.read_later),
        holding its reading's lock as read_whole() does; stopped by `cancel`, it goes on from where
        it stopped at the next call."""
        return (yield from self._bank.read_alone(self.in_progress, self.claimant, cancel, in_turn=in_turn, stoppable=stoppable))

    def read_bank(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Read the document as a passage bank (passage_bank.py), and save it: the questions read
        fast after it load the passages they choose instead of reading them."""
        return self._bank.read(cancel)
