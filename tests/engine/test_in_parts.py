"""A question about the whole document answered in parts: each part asked the question in turn,
the answer each part's under its heading; the parts cut between sentences, the sources placed in
the whole document."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvchat.documents import Document, Page
from kvchat.engine import AskSettings, Engine, part_store, state_store
from kvchat.engine.answering.in_parts import PART_SYSTEM, PART_TOKENS, answer_in_parts, part_of, part_ranges
from kvchat.engine.answering.whole_question import about_whole, answers_in_parts
from kvchat.errors import CancelledError, SettingsError
from kvchat.events import Done, Notice, Progress, Source, Stats, Token
from kvchat.policy import SnapKV

TEXT = " ".join(f"Clause {i}: the supplier delivers {i * 7} boxes in week {i}." for i in range(1, 121))


def test_parts_hold_whole_sentences_up_to_their_size_and_cover_the_text() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - a word a token
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    ranges = part_ranges(document, words, 100)
    assert len(ranges) == 12 and ranges[0][0] == 0 and ranges[-1][1] == len(TEXT)
    assert all(end <= next_start for (_, end, _), (next_start, _, _) in zip(ranges, ranges[1:]))
    assert all(tokens <= 100 and TEXT[start:end].startswith("Clause ") and TEXT[start:end].rstrip().endswith(".")
               for start, end, tokens in ranges)
    assert sum(tokens for _, _, tokens in ranges) == words(TEXT)


def test_a_part_keeps_its_pages_and_says_which_part_it_is() -> None:
    first, second = "Page one has the term.", "Page two has the law."
    text = f"{first}\n\n{second}"
    pdf = Document(Path("a.pdf"), "pdf", text, [Page(1, 0, len(first)), Page(2, len(first) + 2, len(text))])
    part = part_of(pdf, len(first) + 2, len(text), "part 2 of 2")
    assert part.path == Path("a.pdf (part 2 of 2)") and part.text == second
    assert part.pages == [Page(2, 0, len(second))]


def test_a_whole_document_question_is_asked_of_each_part_in_turn(tiny_model_path: Path, isolated_home: Path) -> None:
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    with Engine(str(tiny_model_path)) as engine:
        ranges = part_ranges(document, engine.model.count_tokens, 512)
        settings = AskSettings(in_parts="on", part_tokens=512, max_tokens=6, threads=2, method=SnapKV(budget=1024))
        events = list(engine.ask(document, "List every delivery.", settings))
    n_parts = len(ranges)
    assert n_parts >= 3
    assert events[0] == Notice(f"a question about the whole document: answering it from each of its {n_parts} parts in turn")
    progress = [event for event in events if isinstance(event, Progress)]
    assert [p.done for p in progress] == sorted(p.done for p in progress) and progress[-1].done == progress[-1].total
    done = events[-1]
    assert isinstance(done, Done) and done.stats.read == f"in {n_parts} parts"
    # every part read whole, none pruned; each answered with at most max_tokens
    assert done.stats.kept_tokens == done.stats.prompt_tokens > sum(tokens for _, _, tokens in ranges)
    assert n_parts <= done.stats.generated_tokens <= 6 * n_parts
    assert done.answer == "".join(event.text for event in events if isinstance(event, Token))
    headings = [line for line in done.answer.split("\n") if line.startswith("Part ")]
    assert headings == [f"Part {n} of {n_parts} (from line 1):" for n in range(1, n_parts + 1)]

    assert 0 < len(done.sources) <= n_parts and all(source.text == " ".join(TEXT[source.start:source.end].split())
                                                    for source in done.sources)
    saved = sorted(entry.header.document for entry in part_store().entries())
    assert saved == sorted(f"deliveries.txt (part {n} of {n_parts})" for n in range(1, n_parts + 1))
    assert state_store().entries() == []  # the user's saved readings are another store's


@pytest.mark.system
def test_a_whole_document_question_evicts_no_reading_the_user_saved(tiny_model_path: Path, tmp_path: Path) -> None:
    """The saved readings' store full to its cap with what `kvchat read` saved (another document):
    the parts' readings go to a store of their own and, past its cap, evict only parts (the oldest
    first)."""
    path = tmp_path / "deliveries.txt"
    path.write_text(TEXT)
    document = Document(path, "text", TEXT, [Page(1, 0, len(TEXT))])
    settings = AskSettings(in_parts="on", part_tokens=512, max_tokens=2, threads=2)
    notes = tmp_path / "notes.txt"
    notes.write_text("The boat was named the Grey Heron. " * 20)
    with Engine(str(tiny_model_path)) as engine:
        list(engine.read_whole(Document(notes, "text", notes.read_text(), [Page(1, 0, 700)]), AskSettings(threads=2)))
        (read,) = state_store().entries()
        engine.states.store.max_bytes = read.size  # one more reading saved there would evict it
        list(engine.ask(document, "List every delivery.", settings))
        parts = part_store().entries()
        assert len(parts) == len(part_ranges(document, engine.model.count_tokens, 512)) >= 3
        part_store().clear()
        cap = sum(sorted(entry.size for entry in parts)[-2:])  # room for two parts
        engine.part_states.store.max_bytes = cap
        list(engine.ask(document, "List every delivery.", settings))
        kept = part_store().entries()
    assert [entry.path for entry in state_store().entries()] == [read.path]
    names = {entry.header.document for entry in kept}
    assert f"{path} (part {len(parts)} of {len(parts)})" in names and f"{path} (part 1 of {len(parts)})" not in names
    assert 2 <= len(kept) < len(parts) and sum(entry.size for entry in kept) <= cap


def test_parts_smaller_than_an_answer_is_worth_are_refused() -> None:
    with pytest.raises(SettingsError, match="parts of at least 256 tokens"):
        AskSettings(part_tokens=100)
    with pytest.raises(SettingsError, match="unknown `in_parts` 'always'"):
        AskSettings(in_parts="always")


def test_the_wording_tells_a_question_about_the_whole_document_from_a_lookup() -> None:
    whole = ["Summarize this agreement.", "Please help me summarize this government report.", "Summarize the whole meeting.",
             "Give me an overview of the report.", "What is this document about?", "What are the key terms of this agreement?",
             "List and quote every clause of this contract about audit rights.", "List every obligation of the reseller.",
             "What are all the ways either party can terminate?", "Compare the payment terms of the two agreements."]
    lookups = ["What is the termination clause?", "Who are the parties?", "Summarize the confidentiality clause.",
               "Summarize the discussion on latency in the system", "What baselines do they compare to?",
               "What law governs the contract?", "Is there a cap on liability?", "How many layers does the model have?"]
    assert [question for question in whole if not about_whole(question)] == []
    assert [question for question in lookups if about_whole(question)] == []
    assert answers_in_parts(AskSettings().in_parts, "Summarize this agreement.")
    assert not answers_in_parts("off", "Summarize this agreement.")
    assert answers_in_parts("on", "Who are the parties?")


class _PartAnswerer:
    """A conversation whose every answer is "Clause" and which part it is; records the settings it was given."""

    told: list[AskSettings] = []
    stop_reason = "eos"
    stopped_in: str | None = None  # the part whose reading is stopped ("part 3 of 5")

    def __init__(self, document: Document, settings: AskSettings, _saves: bool) -> None:
        self.document = document
        self.settings = settings
        self.source_finder = None  # its Done names its source itself
        self.run = SimpleNamespace(cache=SimpleNamespace(positions=np.arange(100)))  # the kept prompt alone: no attention to read
        _PartAnswerer.told.append(settings)

    def open(self, question=None, *, cancel=None):
        yield Progress(5, 10, 0.1)
        if _PartAnswerer.stopped_in and self.document.path.name.endswith(f"({_PartAnswerer.stopped_in})"):
            raise CancelledError("stopped", "")
        yield Progress(10, 10, 0.2)

    def select(self, question, cancel, settings):
        yield from ()
        return SimpleNamespace(kept=100)

    def decode(self, selected, settings, cancel):
        stats = Stats("m", "full", 1024, 100, 100, 0, 2, 1, 1, 100.0, 10.0, 0.1, 0.1, 100, _PartAnswerer.stop_reason)
        which = self.document.path.name.split("(")[1].rstrip(")")  # "part 2 of 5"
        yield Token("Clause ")
        yield Token(which)
        yield Done(f"Clause {which}", stats, (Source(0, 6, "Clause", 1.0, "line 1"),))

    def close(self) -> None:
        pass


def _parts_answer(settings: AskSettings) -> list[object]:
    words = lambda text: len(text.split())  # noqa: E731 - a word a token
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    _PartAnswerer.told = []
    return list(answer_in_parts(_PartAnswerer, document, "List every delivery.", settings, words))


def test_the_answer_is_each_parts_under_its_heading_with_its_sources_in_the_whole_document() -> None:
    events = _parts_answer(AskSettings(part_tokens=256, max_tokens=6))
    done = events[-1]
    assert isinstance(done, Done) and len(_PartAnswerer.told) == 5
    starts = [start for start, _, _ in part_ranges(Document(Path("d"), "text", TEXT), lambda text: len(text.split()), 256)]
    assert done.answer == "\n\n".join(f"Part {n} of 5 (from line 1):\n\nClause part {n} of 5" for n in range(1, 6))
    assert done.answer == "".join(event.text for event in events if isinstance(event, Token))
    # the first heading after the first part's reading (a reading bar until the text begins), the others before theirs
    kinds = [type(event).__name__ for event in events[1:-1]]
    assert kinds[:6] == ["Progress", "Progress", "Token", "Token", "Token", "Token"] and kinds[6:8] == ["Progress", "Progress"]
    assert [(source.start, source.text) for source in done.sources] == [(start, "Clause") for start in starts]
    sizes = [len(TEXT[a:b].split()) for a, b in zip(starts, [*starts[1:], len(TEXT)])]
    progress = [event for event in events if isinstance(event, Progress)]
    assert progress[-1].done == sum(sizes)
    # each part's speed is its own reading's: its time, from where it began, not the answer's wall time since it began
    assert [event.elapsed_s for event in progress] == [0.1, 0.2] * 5
    assert [event.read_from for event in progress] == [before for before in np.cumsum([0, *sizes[:-1]]).tolist() for _ in range(2)]
    stats = done.stats
    assert (stats.read, stats.prompt_tokens, stats.generated_tokens, stats.stop_reason) == ("in 5 parts", 500, 10, "eos")


def test_a_part_answer_its_length_cut_says_so() -> None:
    _PartAnswerer.stop_reason = "max_tokens"
    try:
        events = _parts_answer(AskSettings(part_tokens=256, max_tokens=6))
    finally:
        _PartAnswerer.stop_reason = "eos"
    done = events[-1]
    assert done.answer.startswith("Part 1 of 5 (from line 1):\n\nClause part 1 of 5 …\n\nPart 2 of 5")
    assert done.answer.count(" …") == 5 and done.answer == "".join(event.text for event in events if isinstance(event, Token))


@pytest.mark.parametrize("part", [1, 3])
def test_an_answer_stopped_while_a_part_is_read_ends_with_what_was_shown(part: int) -> None:
    _PartAnswerer.stopped_in = f"part {part} of 5"
    try:
        if part == 1:  # nothing shown yet: stopped as any reading is
            with pytest.raises(CancelledError):
                _parts_answer(AskSettings(part_tokens=256, max_tokens=6))
            return
        events = _parts_answer(AskSettings(part_tokens=256, max_tokens=6))
    finally:
        _PartAnswerer.stopped_in = None
    done = events[-1]
    assert done.answer.endswith("Clause part 2 of 5\n\nPart 3 of 5 (from line 1):\n\n")  # its heading was shown
    assert done.answer == "".join(event.text for event in events if isinstance(event, Token))
    assert (done.stats.stop_reason, done.stats.read, len(done.sources)) == ("cancelled", "in 2 parts", 2)


def test_the_parts_are_told_to_keep_every_point_unless_the_user_gives_a_system_prompt() -> None:
    for system, expected in ((None, PART_SYSTEM), ("Answer in French.", "Answer in French.")):
        _parts_answer(AskSettings(system=system, part_tokens=256, max_tokens=512))
        assert {settings.system for settings in _PartAnswerer.told} == {expected}
        assert {(settings.max_tokens, settings.method.name, settings.read) for settings in _PartAnswerer.told} == {
            (PART_TOKENS, "full", "full")}


def test_a_conversation_answers_a_summary_from_the_parts_and_reads_the_document_for_the_next_question(
    tiny_model_path: Path, isolated_home: Path,
) -> None:
    text = TEXT[: TEXT.index("Clause 41:")].strip()
    document = Document(Path("deliveries.txt"), "text", text, [Page(1, 0, len(text))])
    with Engine(str(tiny_model_path)) as engine:
        settings = AskSettings(part_tokens=512, max_tokens=6, threads=2, method=SnapKV(budget=1024))
        n_parts = len(part_ranges(document, engine.model.count_tokens, 512))
        conversation = engine.conversation(document, settings)
        try:
            summary = list(engine.answer(conversation, "Summarize this document."))
            unread_after_summary = conversation.unread
            lookup = list(engine.answer(conversation, "How many boxes come in week 7?"))
        finally:
            conversation.close()
        off = list(engine.ask(document, "Summarize this document.", replace(settings, in_parts="off")))
    assert n_parts >= 2 and unread_after_summary  # the parts answered: the document itself is not read yet
    assert summary[-1].read_later and not lookup[-1].read_later  # so it is to be read whole, until it is
    assert summary[0].text.startswith("a question about the whole document") and summary[-1].stats.read == f"in {n_parts} parts"
    stats = lookup[-1].stats  # selected from the whole reading, the summary's turn pinned besides the budget
    assert stats.read == "full" and stats.prompt_tokens > stats.kept_tokens > 1024
    assert sum(isinstance(event, Progress) for event in lookup) >= 1 and not conversation.unread  # read whole, then selected
    assert [turn.question for turn in conversation.turns] == ["Summarize this document.", "How many boxes come in week 7?"]
    assert [turn.answer for turn in conversation.turns] == [summary[-1].answer, lookup[-1].answer]
    assert not any(isinstance(event, Notice) and "whole document" in event.text for event in off) and off[-1].stats.read == "full"
