"""Sources: passages of the document text, ranked by the attention an answer paid them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document, Page, bundle, load_document
from kvchat.engine import AskSettings, Engine
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.answering import from_kept
from kvchat.engine.answering.attention import answer_attention
from kvchat.engine.text.document_text import token_char_ranges
from kvchat.engine.prompt import document_part
from kvchat.engine.prompt_text import prompt_text
from kvchat.engine.text.sources import MAX_PASSAGE, MIN_PASSAGE, SourceFinder, passages
from kvchat.errors import DecodeError
from kvchat.events import Done, Notice
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits
from tests.documents.test_normalize import make_text_pdf

CONTRACT = (
    "1. Term\nThis Agreement starts on the Effective Date and lasts five years. It renews for one year at a time.\n"
    "2. Notice\nEither party may stop a renewal by written notice given sixty days before the end of the term.\n"
    "3. Law\nThis Agreement is governed by the laws of the State of Israel. " + "Filler words go here. " * 12
)
FULL = SnapKV(budget=100_000, window=16)


def _words(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges of a made-up tokenizer: one token per word, and two template tokens first."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    starts = np.array([0, 0] + [s for s, _ in spans])
    ends = np.array([0, 0] + [e for _, e in spans])
    return starts, ends


def _planted(document: Document, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions and scores: every token of text[start:end] drew 1, the template drew 50, and
    a question after the document 100 (neither is document text)."""
    starts, ends = _words(document.text)
    positions = np.arange(len(starts) + 5)
    scores = np.zeros(len(positions))
    scores[:2], scores[len(starts):] = 50.0, 100.0
    scores[: len(starts)][(starts >= start) & (ends <= end) & (ends > starts)] = 1.0
    return positions, scores


def test_passages_are_sentences_and_lines_of_bounded_length() -> None:
    text = CONTRACT + "\n" + "word " * 120
    found = passages(text)
    assert all(a < b <= c for (a, b), (c, _) in zip(found, found[1:]))
    assert all(end - start <= MAX_PASSAGE for start, end in found)
    covered = np.zeros(len(text), dtype=bool)
    for start, end in found:
        covered[start:end] = True
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())  # every word is in a passage
    texts = [text[start:end] for start, end in found]
    assert "2. Notice\nEither party may stop a renewal by written notice given sixty days before the end of the term." in texts
    assert all(len(piece) >= MIN_PASSAGE for piece in texts[:-1])


def test_legal_abbreviations_and_initials_do_not_end_a_passage() -> None:
    text = ("This Agreement is made between Todos Medical Ltd. and Care G. B.\nPlus Ltd., an Israeli company. "
            "It is governed by the laws of the U.S. and of Israel, e.g. its courts. Notices go to its office at 1 Hamada St., Rehovot, Israel.")
    texts = [text[start:end] for start, end in passages(text)]
    assert texts == ["This Agreement is made between Todos Medical Ltd. and Care G. B.\nPlus Ltd., an Israeli company.",
                     "It is governed by the laws of the U.S. and of Israel, e.g. its courts.",
                     "Notices go to its office at 1 Hamada St., Rehovot, Israel."]


def test_the_planted_passage_is_the_first_source_and_template_and_question_never_are() -> None:
    document = Document(Path("c.txt"), "text", CONTRACT, [Page(1, 0, len(CONTRACT))])
    clause = CONTRACT.index("Either party")
    finder = SourceFinder(document, _words(CONTRACT))
    sources = finder.sources(*_planted(document, clause, CONTRACT.index("\n3. Law")))
    assert len(sources) == 1  # only the planted passage drew attention from the document's text
    source = sources[0]
    assert source.text == "2. Notice Either party may stop a renewal by written notice given sixty days before the end of the term."
    assert CONTRACT[source.start : source.end].split() == source.text.split()
    assert source.score == 1.0 and source.where == "line 3" and source.page is None


def test_where_a_source_is_in_a_pdf_an_epub_and_several_documents() -> None:
    first, second = "Page one ends with a long sentence about the term of this agreement", "and it goes on. Page two says that the laws of the State of Israel govern it."
    text = f"{first}\n\n{second}"
    pdf = Document(Path("a.pdf"), "pdf", text, [Page(1, 0, len(first)), Page(2, len(first) + 2, len(text))])
    law = text.index("Page two")
    finder = SourceFinder(pdf, _words(text))
    (source,) = finder.sources(*_planted(pdf, law, len(text)))
    assert (source.where, source.page) == ("p. 2", 2)
    (across,) = finder.sources(*_planted(pdf, text.index("about the term"), text.index("goes on.")))
    assert across.where == "pp. 1–2" and across.page == 1
    epub = Document(Path("b.epub"), "epub", text, pdf.pages)
    assert SourceFinder(epub, _words(text)).sources(*_planted(epub, law, len(text)))[0].where == "ch. 2"
    pair = bundle([Document(Path("one.txt"), "text", CONTRACT, [Page(1, 0, len(CONTRACT))]), pdf])
    at = pair.text.index("Page two")
    (source,) = SourceFinder(pair, _words(pair.text)).sources(*_planted(pair, at, len(pair.text)))
    assert (source.where, source.document, source.page) == ("a.pdf, p. 2", "a.pdf", 2)
    clause = pair.text.index("Either party")
    (source,) = SourceFinder(pair, _words(pair.text)).sources(*_planted(pair, clause, pair.text.index("\n3. Law")))
    assert source.where == "one.txt, line 3" and source.page is None
    with_book = bundle([Document(Path("one.txt"), "text", CONTRACT, [Page(1, 0, len(CONTRACT))]), epub])
    (source,) = SourceFinder(with_book, _words(with_book.text)).sources(*_planted(with_book, with_book.text.index("Page two"), len(with_book.text)))
    assert (source.where, source.page) == ("b.epub, ch. 2", 2)


def test_a_token_belongs_to_the_passage_of_its_last_character() -> None:
    """Byte-level BPE tokens carry the space before a word: " Israel" starts in the gap between
    two sentences, and belongs to the second."""
    text = "The term of this Agreement is five years from the Effective Date. The law is that of Israel, always and forever."
    second = text.index("The law")
    starts = np.array([0, second - 1, text.index(" Israel")])
    ends = np.array([3, second + 3, text.index(" Israel") + 7])
    document = Document(Path("c.txt"), "text", text, [Page(1, 0, len(text))])
    sources = SourceFinder(document, (starts, ends)).sources(np.array([1, 2]), np.array([1.0, 1.0]))
    assert [source.text for source in sources] == ["The law is that of Israel, always and forever."]


def test_a_passage_never_joins_two_documents() -> None:
    short = Document(Path("a.txt"), "text", "Some opening words.\nA short last line", [Page(1, 0, 37)])
    pair = bundle([short, Document(Path("b.txt"), "text", CONTRACT, [Page(1, 0, len(CONTRACT))])])
    second = pair.text.index("=== b.txt")
    assert all(end <= second or start >= second for start, end in SourceFinder(pair, _words(pair.text))._passages)


def test_no_sources_without_token_ranges_or_attention_on_the_text() -> None:
    document = Document(Path("c.txt"), "text", CONTRACT, [Page(1, 0, len(CONTRACT))])
    positions, scores = _planted(document, 0, len(CONTRACT))
    assert SourceFinder(document, None).sources(positions, scores) == ()
    scores[2 : len(_words(CONTRACT)[0])] = 0.0
    assert SourceFinder(document, _words(CONTRACT)).sources(positions, scores) == ()


# ---- on the tiny model --------------------------------------------------------------------------


def _plant_on(monkeypatch: pytest.MonkeyPatch, engine: Engine, document: Document, start: int, end: int) -> None:
    """Make the answer's attention fall on the tokens of document.text[start:end] alone."""
    held = prompt_text(document)  # as the prompt holds it: a PDF's pages after their marks
    part = document_part(engine.model, held.text)
    ranges = token_char_ranges(engine.model, part.text, held.text, part.tokens(engine.model))
    assert ranges is not None
    starts, ends = held.document_ranges(*ranges)
    target = np.flatnonzero((starts >= start) & (ends <= end) & (ends > starts))
    reobserve = KvCache.reobserve
    if hasattr(reobserve, "targets"):  # planted already: add these tokens to the planted ones
        reobserve.targets.append(target)
        return
    targets = [target]

    def planted(cache: KvCache, first_cell: int, count: int) -> np.ndarray:
        votes = reobserve(cache, first_cell, count)
        return np.where(np.isin(cache.origins[:first_cell], np.concatenate(targets)), 1.0, 0.0) * np.ones_like(votes)

    planted.targets = targets  # type: ignore[attr-defined]
    monkeypatch.setattr(KvCache, "reobserve", planted)


def _answer(engine: Engine, document: Document, **settings: object) -> Done:
    settings = {"method": FULL, "max_tokens": 6, "threads": 2, **settings}
    events = list(engine.ask(document, "Which law governs it?", AskSettings(**settings)))
    assert isinstance(events[-1], Done)
    return events[-1]


def test_an_answers_planted_attention_names_its_passage_and_page(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    law = "This Agreement is governed by the laws of the State of Israel."
    pdf = make_text_pdf(tmp_path / "contract.pdf", [["The term is five years from the Effective Date of this Agreement."] * 6, [law] * 2])
    document = load_document(pdf)
    start = document.pages[1].start
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        _plant_on(monkeypatch, engine, document, start, start + len(law))
        done = _answer(engine, document)
    first = done.sources[0]
    assert first.text == law
    assert (first.where, first.page, first.start) == ("p. 2", 2, start) and first.score == 1.0


def test_a_real_answer_has_consistent_sources_and_none_when_off(tiny_model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "contract.txt"
    path.write_text(CONTRACT * 3)
    document = load_document(path)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        full, pruned = _answer(engine, document), _answer(engine, document, method=SnapKV(budget=64, window=16))
        off = _answer(engine, document, sources=False)
    for done in (full, pruned):
        assert 1 <= len(done.sources) <= 3
        assert [s.score for s in done.sources] == sorted((s.score for s in done.sources), reverse=True)
        assert 0 < sum(s.score for s in done.sources) <= 1.0 + 2e-4  # each rounded to 4 places
        for source in done.sources:
            assert document.text[source.start : source.end].split() == source.text.split()
            assert source.where == f"line {document.text.count(chr(10), 0, source.start) + 1}"
    assert off.sources == ()


def test_a_streamed_reading_names_the_passage_it_kept_after_positions_were_repacked(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    """Over the tiny model's trained context the document is read streamed and its positions
    are repacked: sources still name the text each cell holds."""
    law = "This Agreement is governed by the laws of the State of Israel."
    path = tmp_path / "long.txt"
    path.write_text(("The ledger was kept in the blue cabinet. " * 16 + law + "\n") * 10)
    document = load_document(path)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        for match in re.finditer(re.escape(law), document.text):  # attention on every copy of the law
            _plant_on(monkeypatch, engine, document, match.start(), match.end())
        done = _answer(engine, document, method=SnapKV(budget=512, window=16))
    assert done.stats.method == "snapstream" and done.stats.prompt_tokens > 4096
    assert done.sources and all(source.text == law for source in done.sources)  # no other passage drew any


def test_a_failure_to_find_sources_is_a_notice_and_the_answer_stands(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "contract.txt"
    path.write_text(CONTRACT)

    def failing(cache: KvCache, n_prompt_cells: int) -> None:
        raise DecodeError("llama.cpp rejected the batch as invalid", "")

    monkeypatch.setattr(from_kept, "answer_attention", failing)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        events = list(engine.ask(load_document(path), "Which law governs it?", AskSettings(method=FULL, max_tokens=6, threads=2)))
    assert [e.text for e in events if isinstance(e, Notice)] == ["no sources for this answer: llama.cpp rejected the batch as invalid"]
    assert isinstance(events[-1], Done) and events[-1].sources == ()


def test_reading_the_answer_again_leaves_the_cache_as_it_was(tiny_model) -> None:
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(3, 250, size=300)]
    caches = [KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=256, threads=2))) for _ in range(2)]
    for cache in caches:
        cache.decode(tokens)
    positions, token_ids = caches[0].positions.copy(), caches[0].tokens.copy()
    found = answer_attention(caches[0], 280)
    assert found is not None
    cell_positions, scores = found
    assert np.array_equal(cell_positions, np.arange(280)) and scores.shape == (280,)
    assert 0 < scores.sum() < 20 * 1 * 4  # 20 answer rows x the upper layer x 4 heads, less what they paid each other
    assert np.array_equal(caches[0].positions, positions) and np.array_equal(caches[0].tokens, token_ids)
    caches[0].verify()
    for cache in caches:
        cache.decode([17], want_logits=True)
    np.testing.assert_allclose(last_logits(caches[0].ctx), last_logits(caches[1].ctx), atol=1e-4, rtol=1e-4)
    for cache in caches:
        cache.ctx.close()
