"""A question about the whole document answered in parts: each part asked the question, then the
notes together; the parts cut between sentences, the sources placed in the whole document."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvchat.documents import Document, Page
from kvchat.engine import AskSettings, Engine, state_store
from kvchat.engine.in_parts import part_of, part_ranges
from kvchat.errors import SettingsError
from kvchat.events import Done, Notice, Progress, Token
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
        settings = AskSettings(whole=512, max_tokens=6, threads=2, method=SnapKV(budget=128))  # parts larger than the budget
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
        AskSettings(whole=100)
