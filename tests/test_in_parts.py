"""A question about the whole document answered in parts: each part asked the question, then the
notes together; the parts cut between sentences, the sources placed in the whole document."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.documents import Document, Page
from kvchat.engine import AskSettings, Engine, state_store
from kvchat.engine.in_parts import NOTES_SYSTEM, PART_SYSTEM, notes_on_parts, notes_settings, part_of, part_ranges
from kvchat.engine.whole_question import about_whole
from kvchat.errors import SettingsError
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


def test_a_whole_document_question_is_asked_of_each_part_then_of_the_notes(tiny_model_path: Path, isolated_home: Path) -> None:
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    with Engine(str(tiny_model_path)) as engine:
        n_parts = len(part_ranges(document, engine.model.count_tokens, 512))
        # parts larger than the budget, read whole; their notes (at most 192 tokens each) within it
        settings = AskSettings(whole="on", part_tokens=512, max_tokens=6, threads=2, method=SnapKV(budget=1024))
        events = list(engine.ask(document, "List every delivery.", settings))
    assert n_parts >= 3
    assert events[0] == Notice(f"a question about the whole document: asking each of its {n_parts} parts, then their notes together")
    progress = [event for event in events if isinstance(event, Progress)]
    assert [p.done for p in progress] == sorted(p.done for p in progress) and progress[-1].done == progress[-1].total
    done = events[-1]
    assert isinstance(done, Done) and done.stats.read == f"in {n_parts} parts"
    assert done.stats.kept_tokens == done.stats.prompt_tokens > len(TEXT.split())  # every part and the notes whole, none pruned
    assert done.answer == "".join(event.text for event in events if isinstance(event, Token))
    assert 0 < len(done.sources) <= n_parts and all(source.text == " ".join(TEXT[source.start:source.end].split())
                                                    for source in done.sources)
    assert [source.score for source in done.sources] == sorted((source.score for source in done.sources), reverse=True)
    saved = sorted(entry.header.document for entry in state_store().entries())
    assert saved == sorted(f"deliveries.txt (part {n} of {n_parts})" for n in range(1, n_parts + 1))  # the notes are not kept


def test_parts_smaller_than_a_note_is_worth_are_refused() -> None:
    with pytest.raises(SettingsError, match="parts of at least 256 tokens"):
        AskSettings(part_tokens=100)
    with pytest.raises(SettingsError, match="unknown whole-document answering 'always'"):
        AskSettings(whole="always")


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
    assert AskSettings().answers_in_parts("Summarize this agreement.")
    assert not AskSettings(whole="off").answers_in_parts("Summarize this agreement.")
    assert AskSettings(whole="on").answers_in_parts("Who are the parties?")


class _NoteTaker:
    """A conversation whose every answer is a note of 40 words; records what it was asked about."""

    asked: list[str] = []

    def __init__(self, document: Document) -> None:
        self.document = document

    def open(self, question=None, *, cancel=None):
        return iter(())

    def ask(self, question, settings=None, *, cancel=None):
        _NoteTaker.asked.append(self.document.path.name)
        stats = Stats("m", "full", 1024, 10, 10, 0, 40, 1, 1, 100.0, 10.0, 0.1, 0.1, 10, "eos")
        yield Done(" ".join(["word"] * 40), stats, (Source(0, 6, "Clause", 1.0, "line 1"),))

    def close(self) -> None:
        pass


def test_notes_over_the_budget_are_asked_again_in_runs_until_they_fit() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - a word a token
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    n_parts = len(part_ranges(document, words, 256))
    _NoteTaker.asked = []
    settings = AskSettings(part_tokens=256, method=SnapKV(budget=128))
    events = notes_on_parts(lambda part, _, __: _NoteTaker(part), document, "List every delivery.", settings, words)
    notes = _returned(events)
    # five notes of 40 words: runs of two asked again (the fifth goes on alone), then the first two of those
    assert n_parts == 5 and notes.parts == 5 and len(notes.stats) == 5 + 2 + 1
    assert _NoteTaker.asked == [f"deliveries.txt (part {n} of 5)" for n in range(1, 6)] + ["deliveries.txt (notes)"] * 3
    assert [line for line in notes.document.text.splitlines() if line.endswith(":")][1:] == ["Parts 1 to 4 of 5:", "Part 5 of 5:"]
    assert words(notes.document.text) <= 128


def test_the_parts_and_the_notes_are_told_to_keep_every_point_unless_the_user_gives_a_system_prompt() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - a word a token
    document = Document(Path("deliveries.txt"), "text", TEXT, [Page(1, 0, len(TEXT))])
    told: list[str | None] = []

    def note_taker(part: Document, settings: AskSettings, _: bool) -> _NoteTaker:
        told.append(settings.system)
        return _NoteTaker(part)

    for system, expected in ((None, {PART_SYSTEM, NOTES_SYSTEM}), ("Answer in French.", {"Answer in French."})):  # notes asked again too
        told.clear()
        _returned(notes_on_parts(note_taker, document, "Summarize this.", AskSettings(system=system, part_tokens=256, method=SnapKV(budget=128)), words))
        assert set(told) == expected and notes_settings(AskSettings(system=system)).system == (system or NOTES_SYSTEM)


def _returned(generator):
    """What a generator returns, its events left unheard."""
    try:
        while True:
            next(generator)
    except StopIteration as stop:
        return stop.value


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
            opened = list(conversation.open("Summarize this document."))
            summary = list(conversation.ask("Summarize this document."))
            unread_after_summary = conversation.unread
            lookup = list(conversation.ask("How many boxes come in week 7?"))
        finally:
            conversation.close()
        off = list(engine.ask(document, "Summarize this document.", replace(settings, whole="off")))
    assert n_parts >= 2 and opened == [] and unread_after_summary  # the parts answered: the document itself is not read yet
    assert summary[0].text.startswith("a question about the whole document") and summary[-1].stats.read == f"in {n_parts} parts"
    stats = lookup[-1].stats  # selected from the whole reading, the summary's turn pinned besides the budget
    assert stats.read == "full" and stats.prompt_tokens > stats.kept_tokens > 1024
    assert sum(isinstance(event, Progress) for event in lookup) >= 1 and not conversation.unread  # read whole, then selected
    assert [turn.question for turn in conversation.turns] == ["Summarize this document.", "How many boxes come in week 7?"]
    assert [turn.answer for turn in conversation.turns] == [summary[-1].answer, lookup[-1].answer]
    assert not any(isinstance(event, Notice) and "whole document" in event.text for event in off) and off[-1].stats.read == "full"
