"""A conversation about a document (or several): the document, its reading (read or loaded once)
and its turns. How a question is answered on it, in parts or from the entries its reading keeps,
with its sources, is the answering route's (answering/route.py).

How the document comes into the cache is the conversation's way of reading (reading/ways/reading.py,
chosen by reading/ways/registry.py): whole, streamed within the budget (a streaming method, or a
document too long to read whole whose questions read in full: reading/sizing.py), or fast for the
questions asked before the document is read (select()), the follow-ups then loading their passages
from its passage bank (the default), or selected from its whole reading (`read` fast); a document
too long to read whole is read fast for every question.
What each answer is chosen from is its Selection (selections/): by default every question
selects anew from the document's reading, with the earlier turns pinned. Several documents come
as one bundle (documents/bundle.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterable, Iterator
from functools import cached_property

from kvchat.documents import Document
from kvchat.engine.text.document_text import PreparedDocument, prepare
from kvchat.engine.text.sources import SourceFinder
from kvchat.engine.kvcache.in_progress import ReadingsInProgress, WholeReadingDone, read_alone
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.prompt import PromptPart, Turn, chat_messages, split_rendered
from kvchat.engine.reading.cheap_pass import (
    CheapPass, fast_is_sooner, fast_reading_s, question_reads_fast, reread_tokens, speed_kind,
)
from kvchat.engine.reading.bank_reading import BankReading
from kvchat.engine.reading.later import LaterReadings
from kvchat.engine.reading.passage_bank import DamagedBank
from kvchat.engine.text.passages import Passages, Question
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.registry import reading_of
from kvchat.engine.reading.selected import Selected
from kvchat.engine.reading.sizing import (
    RING_MIN, answers_whole_on_gpu, check_prompt, context_size, reading_settings, reads_whole, round_up,
)
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.reading.chunked import stream_context_size
from kvchat.engine.reading.ways.reading import DocumentPrompt
from kvchat.engine.selections import selection_named
from kvchat.engine.settings import AskSettings
from kvchat.errors import SettingsError
from kvchat.events import Event, LaterReading, Notice
from kvchat.llama import LlamaModel

CONVERSATION_ROOM = 1024


class Conversation(LaterReadings):
    """One document and the turns so far, on one context; answering/route.py answers on it. What it
    reads after the first answer is its LaterReadings' (reading/later.py)."""

    def __init__(
        self,
        model: LlamaModel,
        model_name: str,
        document: Document,
        settings: AskSettings,
        *,
        states: DocumentStates | None = None,
        speeds: ReadingSpeeds | None = None,
        cheap_pass: CheapPass = CheapPass(),
        in_progress: ReadingsInProgress | None = None,
        prepared: PreparedDocument | None = None,
    ) -> None:
        """`in_progress`: the readings other processes are doing, so that read_on() never reads
        the document beside one of them; `prepared`: the document as prepare() makes it with
        the settings' system prompt, where an earlier conversation made it."""
        self.model = model
        self.model_name = model_name
        self.document = document
        self.selection = selection_named(settings.select)  # kept for the conversation: a Reuse remembers its first choice
        self.speeds = speeds  # what a reading measures, remembered for `kvchat inspect`
        self.in_progress = in_progress
        self.turns: list[Turn] = []
        self._system = settings.system  # the conversation's: its document part (and saved reading) holds it
        prepared = prepared or prepare(model, document, self._system)
        self._prompt_text = prepared.held  # the document's text with its pages' marks
        self.document_tokens = prepared.tokens
        self._text = prepared.text
        self._cheap_pass = cheap_pass
        self.settings, self._notice, self.reading = reading_of(model, len(self.document_tokens), settings, cheap_pass.drafted)
        # nothing saved is loaded where reading again is sooner: streamed, or the whole cache on a GPU
        # (an H200 read 24K tokens in 1.3 s and loaded a saved reading of 7K in 1.2 s)
        read_again = self.settings.method.streams or answers_whole_on_gpu(model, len(self.document_tokens), settings)
        self.states = None if read_again or states is None else states.for_settings(self.settings)
        self._whole = reads_whole(model, len(self.document_tokens))  # False: read fast or streamed, never whole
        self._prompt = DocumentPrompt(self.document_tokens, str(document.path), self.states)
        if settings.method.needs_spans:  # token texts for span-aware selection, prepared with the tokens
            model.pieces_text(self.document_tokens)
        self._n_ctx = self._context_size()  # refuses a document too long for a named method now
        self.prompt_tokens: list[int] = []  # the last question's whole prompt
        self._reading_s = 0.0
        self.opened = False  # open() (done) or skip_reading() was called
        self._unread = False  # the whole reading was deferred: questions read fast meanwhile (select())

    @cached_property
    def run(self) -> PromptRun:
        """The context the document is read into, made when it is first needed: a question the
        document's parts answer (answering/in_parts.py) never holds one as large as the document,
        nor does a fast reading (it grows to what it reads: cheap_pass.make_room); a whole
        reading grows it to the document's (_read())."""
        fast = round_up(self.settings.method.budget + CONVERSATION_ROOM + self.settings.max_tokens)
        return PromptRun(self.model, min(fast, self._n_ctx) if self._unread else self._n_ctx, self.settings, self.model_name,
                         self._cheap_pass)

    @cached_property
    def _bank(self) -> BankReading:
        """The document's passage bank, made when first asked about (its passages are split then)."""
        return BankReading(self.model, self.settings, self.document_tokens, self._text.passages, str(self.document.path),
                           self.states, self.speeds)

    def _context_size(self) -> int:
        if self.settings.method.streams:
            return stream_context_size(self.settings, 64, self.model.shape.n_ctx_train)
        if self._fast_only:  # what its fast readings' context may grow to (cheap_pass.make_room)
            return self.model.shape.n_ctx_train
        reserve = CONVERSATION_ROOM + self.settings.max_tokens
        return context_size(self.model, len(self.document_tokens), self.settings, reserve)

    @property
    def _fast_only(self) -> bool:
        """The document is too long to read whole, and its questions read fast (sizing.reading_settings)."""
        return not self._whole and self.settings.reads_fast(self._cheap_pass.drafted)

    def _split(self, question: str) -> tuple[PromptPart, PromptPart, PromptPart]:
        messages = chat_messages(self._prompt_text.text, self.turns, question, self._system)
        return split_rendered(self.model.apply_chat_template(messages))

    def question_window(self, question: str) -> list[int]:
        """The tokens that observe for `question`: the last `window` of its part of the prompt."""
        _, _, question_part = self._split(question)
        return question_part.tokens(self.model)[-self.settings.method.window :]

    def open(self, question: str | None = None, *, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Read the document (streamed, loaded from a saved state, or in full) and keep it; a whole
        reading that is saved is read alone (_read_alone).

        `question`, when known, observes a streamed reading (query-aware streaming).
        """
        yield from self._open(cancel, question, alone=True)

    def _open(self, cancel: threading.Event | None, question: str | None, alone: bool) -> Iterator[Event]:
        """open(); `alone` False where the caller holds the reading's lock already (read_whole())."""
        if question is not None:
            self.check_question(question)
        if self._notice:
            yield Notice(self._notice)
        if self.reading.defers(self.saved):
            self.opened = self._unread = True  # questions read fast until the document is read whole (select())
            return
        yield from self._read_alone(cancel, question, awaits_own=False) if alone else self._read(cancel, question)
        self.opened = True

    def read_whole(self, cancel: threading.Event | None = None, *, in_turn: bool = False,
                   stoppable: bool = False) -> Generator[Event, None, WholeReadingDone]:
        """Read the document whole and save the reading, unless it is saved (Engine.read_whole),
        holding the reading's lock: while another process reads it, that reading is awaited, not
        loaded (nothing here needs it). A reading read that could not be saved (a full disk, said in
        a Notice) is no reading done: UNSAVED."""
        claimant = self.claimant
        if claimant is None or self.in_progress is None:
            return WholeReadingDone.STREAMED
        how = yield from read_alone(self.in_progress, claimant, lambda: self.saved, lambda: self._open(cancel, None, alone=False),
                                    cancel, in_turn=in_turn, stoppable=stoppable)
        return WholeReadingDone.UNSAVED if how is WholeReadingDone.READ and not self.saved else how

    def skip_reading(self) -> None:
        """Open without reading: the first question is answered without this reading (in parts);
        a follow-up reads fast or the document whole, as after a fast answer (select())."""
        self.opened = self._unread = True

    def _read(self, cancel: threading.Event | None, question: str | None = None) -> Iterator[Event]:
        """Read the document whole the conversation's way; it becomes the restore point."""
        def observer() -> list[int] | None:  # the question's window, when it is known
            return self.question_window(question) if question else None

        self.run.grow(self._n_ctx)  # made for fast readings first
        yield from self.reading.read(self._prompt, self.run, self.settings, cancel, observer)
        self.selection.after_reading(self.run, self.settings.method, self.question_window)
        self._reading_s = self.run.read_s
        if self.speeds is not None and self.run.loaded_upto == 0:
            self.speeds.record(self.reading.speed, len(self.document_tokens), self.run.read_s)

    def reads_fast_first(self) -> bool:
        """Whether the first question will be answered from a fast reading (open() defers the reading)."""
        with_draft = self._cheap_pass.drafted
        return self.reading.defers(self.saved) and question_reads_fast(len(self.document_tokens), self.settings, with_draft, self._whole)

    def check_question(self, question: str, settings: AskSettings | None = None) -> None:
        """Refuse `question` now if its prompt does not fit (sizing.check_prompt), before the
        document is read for it: what select() checks first."""
        _, earlier, question_part = self._split(question)
        self._check(self.settings_for(settings), len(earlier.tokens(self.model)), len(question_part.tokens(self.model)))

    def _check(self, settings: AskSettings, n_earlier: int, n_question: int) -> None:
        """check_prompt with the document's cells while a question is read: all of its tokens; at
        most the budget and a chunk when it is read streamed; at most what a fast reading re-reads
        when it is too long to read whole."""
        n_document = len(self.document_tokens)
        if settings.method.streams:
            n_document = min(n_document, settings.method.budget + settings.stream.chunk)
        elif self._fast_only:
            n_document = min(n_document, reread_tokens(settings, self._cheap_pass.drafted))
        check_prompt(self.model, settings, n_document, n_earlier, n_question)

    def select(self, question: str, cancel: threading.Event | None, settings: AskSettings) -> Iterator[Event]:
        """The entries `question`'s answer is chosen from: the run's cache then holds the kept
        prompt and the last token's logits (decode() answers from them, or the server moves them
        to a sequence of its own); `self.prompt_tokens` is the whole prompt. Returns the run's
        Selected. A prompt that does not fit is refused first, before the context grows for it.
        Before the document is read whole, a question (a follow-up too, its earlier turns read
        with it) is answered from a fast reading of its own, unless the rest of the whole reading
        is sooner: then, and where a fast reading does not pay, the rest is read first."""
        settings = self.settings_for(settings)
        _, earlier, question_part = self._split(question)
        earlier_tokens = earlier.tokens(self.model)
        question_tokens = question_part.tokens(self.model)
        self._check(settings, len(earlier_tokens), len(question_tokens))
        tokens = self.document_tokens + earlier_tokens + question_tokens
        # the document's reading counts towards the TTFT of the answer it was read for
        reading_s = 0.0 if self.turns else self._reading_s
        if self._unread:
            if (yield from self._reads_fast_now(len(tokens), settings)):
                return (yield from self._read_fast(Question(question, self._text.passages, len(earlier_tokens)), tokens,
                                                   settings, cancel))
            if self._fast_only:
                raise SettingsError(f"the document is {len(self.document_tokens):,} tokens, more than the model's context: "
                                    "each question reads the passages it chooses", "ask with `read` auto, fast or retrieval")
            started = time.perf_counter()
            yield from self._read_rest(cancel)
            reading_s = time.perf_counter() - started
        start = self.selection.before_question(self.run, tokens, len(earlier_tokens), self.prompt_tokens if self.turns else None)
        self._make_room(self.run.cache.cells + len(tokens) - self.run.read_upto, settings.max_tokens)
        words = self._text.passages.chosen_by_words(question, settings.method.word_tokens) if settings.method.word_tokens else None
        selection = self.run.select(tokens, settings, start.pinned, cancel, start.prunes, reading_s, words)
        selected = yield from self._text.with_kept_text(selection)
        self.prompt_tokens = tokens
        return selected

    def _reads_fast_now(self, n_prompt: int, settings: AskSettings) -> Generator[Event, None, bool]:
        """Whether a question asked before the document is read whole is answered from a fast
        reading of its `n_prompt`-token prompt: where one is asked for, pays, and is sooner than
        the rest of the whole reading begun here, at this machine's last measured speeds. With
        none begun here it is: the server's reading of an upload was awaited, or not, before this
        conversation was made (BackgroundReadings.rest_of). One asked for by name says why not."""
        with_draft = self._cheap_pass.drafted
        if not settings.reads_fast(with_draft):
            return False
        read, speed = self.run.whole_read_upto, self.speeds.tokens_per_s(self.reading.speed) if self.speeds else None
        awaits = read and speed and self.reading.later is LaterReading.WHOLE  # none awaits a passage bank, nor retrieval
        left_s = (len(self.document_tokens) - read) / speed if awaits else None  # None: nothing to await here
        if not question_reads_fast(n_prompt, settings, with_draft, self._whole):
            why = f"a fast reading would re-read {reread_tokens(settings, with_draft):,} of this prompt's {n_prompt:,} tokens"
        elif not self._whole or fast_is_sooner(fast_reading_s(n_prompt, settings, self.speeds), left_s):  # nothing else reads it, or sooner
            return True
        else:
            why = "the rest of the document's whole reading comes sooner than a fast reading"
        if settings.read != "auto":  # asked for by name: say why not (auto reads in full quietly)
            yield Notice(f"read in full: {why}")
        return False

    def _read_fast(
        self, question: Question, tokens: list[int], settings: AskSettings, cancel: threading.Event | None,
    ) -> Generator[Event, None, Selected]:
        """The Selected of a fast reading of the prompt `tokens` (the run's read_fast(), which makes
        room for what it reads)."""
        self.prompt_tokens = tokens
        bank = yield from self._bank.loaded()
        try:
            selected = yield from self._text.with_kept_text(self.run.read_fast(tokens, settings, cancel, question, bank))
        except DamagedBank as damaged:  # a saved piece the disk changed: the bank goes, the passages are read
            yield from self._bank.discard(str(damaged))
            selected = yield from self._text.with_kept_text(self.run.read_fast(tokens, settings, cancel, question))
        if self.speeds is not None and not selected.loaded_tokens:  # what a fresh fast reading takes (`kvchat inspect`)
            self.speeds.record(speed_kind(settings), len(tokens), time.perf_counter() - selected.started)
        return selected

    def decode(self, selected: Selected, settings: AskSettings, cancel: threading.Event | None) -> Iterator[Event]:
        """The answer to the prompt select() kept, decoded on this context with `settings` (as
        settings_for() made them): Tokens, then Done."""
        return self.run.answer(settings, selected, cancel)

    @property
    def passages(self) -> Passages:
        """The document's passages (text/passages.py): what a question's words choose from."""
        return self._text.passages

    @property
    def source_finder(self) -> SourceFinder:
        """What turns the attention of this document's prompt cells into sources."""
        return self._text.source_finder

    def settings_for(self, settings: AskSettings | None) -> AskSettings:
        """The settings an answer runs with: the conversation's, or `settings` as this document
        is read with them."""
        return self.settings if settings is None else reading_settings(self.model, len(self.document_tokens), settings,
                                                                           self._cheap_pass.drafted)[0]

    def _make_room(self, cells: int, max_tokens: int) -> None:
        """Grow the context when `cells` no longer fit (the answer may use the ring)."""
        needed = cells + RING_MIN
        if needed > self.run.n_ctx:
            limit = max(self.model.shape.n_ctx_train, needed)
            self.run.grow(min(round_up(needed + max_tokens), round_up(limit)))

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        """Character ranges of the document's text (stripped, as the model saw it) that the
        cells at `kept_positions` hold: what a selection kept, for showing to the user."""
        return self._text.kept_spans(kept_positions)

    def reset(self) -> None:
        """Start a new conversation about the same document."""
        self.turns = []

    def resume(self, turns: Iterable[Turn]) -> None:
        """Continue a conversation held elsewhere (the server's client sends its turns back)."""
        self.turns = list(turns)

    def close(self) -> None:
        if "run" in self.__dict__:  # made (cached_property)
            self.run.close()
