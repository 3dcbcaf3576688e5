"""A reading the question chooses: the document cut into passages, BM25 and the cheap pass's
attention ranking them, and the model reading the chosen ones alone (tiny model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation
from kvchat.engine.text.passages import PASSAGE_TOKENS, Passages, names_the_document
from kvchat.engine.settings import FastSettings
from kvchat.engine.answering import route
from kvchat.errors import SettingsError
from kvchat.events import Done, Pruned
from kvchat.policy import SnapKV

from tests.conftest import REPO_DIR

TOPICS = ["orchard apples", "harbour ferries", "governing law", "violin strings", "glacier ice", "copper mines",
          "desert owls", "paper lanterns", "river otters", "clock towers", "salt marshes", "tea gardens"]
BUDGET = 256
WINDOW = 16


def _paragraph(topic: str) -> str:
    """About 200 characters (tokens, with the tiny model's byte vocabulary) on one topic, in
    sentences shorter than policy/spans.py's longest."""
    return " ".join(f"Note {n} is on {topic}." for n in range(7))


DOCUMENT = Document(path=Path("topics.txt"), kind="text", text="\n\n".join(_paragraph(topic) for topic in TOPICS))


def _conversation(tiny_model, **fast: object) -> Conversation:
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), max_tokens=4, threads=2, sources=False,
                           read="fast" if fast else "retrieval", fast=FastSettings(**fast))
    return Conversation(tiny_model, "tiny", DOCUMENT, settings)


def _asked(conversation: Conversation, question: str) -> tuple[Done, Pruned]:
    try:
        list(conversation.open(question))
        events = list(route.answer(conversation, question))
    finally:
        conversation.close()
    (pruned,) = [event for event in events if isinstance(event, Pruned)]
    return events[-1], pruned


def _passages(tiny_model) -> Passages:
    conversation = _conversation(tiny_model)
    return conversation._text.passages


def test_passages_are_whole_sentences_of_at_most_their_size_covering_the_text(tiny_model) -> None:
    passages = _passages(tiny_model)
    text = DOCUMENT.text
    assert "".join(passages.texts) == text  # every character of the text, in order, once
    assert passages.lengths.max() <= PASSAGE_TOKENS and passages.lengths[:-1].min() > PASSAGE_TOKENS - 48
    assert all(piece.startswith(("Note", " Note", "\n\nNote")) and piece.rstrip().endswith(".") for piece in passages.texts)  # cut between sentences
    assert np.array_equal(passages.starts[1:], passages.ends[:-1])
    assert len(passages.always) == passages.n_tokens - int(passages.lengths.sum())  # the template around the text
    assert passages.always.max() == passages.n_tokens - 1 and passages.always.min() == 0


def test_bm25_chooses_the_passages_that_share_the_questions_words(tiny_model) -> None:
    passages = _passages(tiny_model)
    scores = passages.bm25("Which law governs this?")
    about_law = [index for index, text in enumerate(passages.texts) if "governing law" in text]
    assert len(about_law) == 2 and np.flatnonzero(scores > 0).tolist() == about_law  # "law" and "govern(ing)" stems
    most = max(about_law, key=lambda index: passages.texts[index].count("governing law"))
    assert passages.top(scores, BUDGET).tolist() == [most]  # one passage fits the budget: the one saying it most
    assert passages.top(scores, 2 * PASSAGE_TOKENS).tolist() == about_law
    assert passages.top(scores, 2 * PASSAGE_TOKENS, opening=1).tolist() == sorted({0, most})
    assert not passages.bm25("What is it, and why?").any()  # stop words only


def test_the_words_choose_whole_passages_up_to_their_share_and_none_without_a_shared_word(tiny_model) -> None:
    passages = _passages(tiny_model)
    about_law = [index for index, text in enumerate(passages.texts) if "governing law" in text]
    expected = np.concatenate([np.arange(passages.starts[index], passages.ends[index]) for index in about_law])
    assert passages.chosen_by_words("Which law governs this?", 2 * PASSAGE_TOKENS).tolist() == expected.tolist()
    assert len(passages.chosen_by_words("Which law governs this?", 100)) == 100  # one passage, cut to the share
    assert len(passages.chosen_by_words("What is it, and why?", 2 * PASSAGE_TOKENS)) == 0
    assert len(passages.chosen_by_words("Which law governs this?", 0)) == 0


@pytest.mark.parametrize("words", [0.0, 2 / 3])
def test_from_a_whole_reading_the_words_passages_are_kept_within_the_budget_for_a_question_and_its_follow_up(
    tiny_model, words: float,
) -> None:
    settings = AskSettings(method=SnapKV(budget=3 * PASSAGE_TOKENS, window=WINDOW, words=words), max_tokens=4, threads=2,
                           sources=False, read="full")
    conversation = Conversation(tiny_model, "tiny", DOCUMENT, settings)
    passages = conversation._text.passages
    chosen = passages.chosen_by_words("Which law governs this?", 2 * PASSAGE_TOKENS)  # what the words choose
    try:
        list(conversation.open())
        for question in ("Which law governs this?", "And which law governs it?"):
            n_earlier = len(conversation._split(question)[1].tokens(tiny_model))  # the first turn, kept beside the budget
            events = list(route.answer(conversation, question))
            (pruned,) = [event for event in events if isinstance(event, Pruned)]
            assert len(pruned.kept_positions) == 3 * PASSAGE_TOKENS + n_earlier
            assert np.isin(chosen, pruned.kept_positions).all() == (words > 0)  # without words the attention chose other tokens
    finally:
        conversation.close()


def test_a_retrieval_reading_reads_the_chosen_passage_alone_with_the_template_and_question(tiny_model) -> None:
    conversation = _conversation(tiny_model)
    passages = conversation._text.passages
    best = int(np.argmax(passages.bm25("Which law governs this?")))
    done, pruned = _asked(conversation, "Which law governs this?")
    n_prompt = done.stats.prompt_tokens
    expected = np.concatenate([passages.tokens_of(np.array([best]), n_prompt - WINDOW), np.arange(n_prompt - WINDOW, n_prompt)])
    assert done.stats.read == "bm25, 1 passages"
    assert pruned.kept_positions == tuple(expected.tolist())  # read at consecutive positions, remembered by origin
    assert done.stats.kept_tokens == len(expected) < BUDGET + len(passages.always) + 64


def test_a_question_names_the_document_with_this_or_the_and_the_documents_kind() -> None:
    named = ["What is the title of this agreement?", "When did the parties sign this contract?", "Which law governs THE Contract?",
             "What datasets does this paper use?", "What is the paper's title?", "Who wrote the book?", "Summarize the report."]
    not_named = ["Which company is the reseller?", "who plays jennifer in back to the future", "Does this apply to me?",
                 "this agreementation", "Which agreement came first?"]
    assert [names_the_document(question) for question in named] == [True] * len(named)
    assert [names_the_document(question) for question in not_named] == [False] * len(not_named)


def test_the_opening_is_read_beside_the_words_passages_only_for_a_question_that_names_the_document(tiny_model) -> None:
    """As the defaults read (opening_for "document"): the opening passage in the place of the
    words' last one only where the question names the document (this agreement)."""
    budget = 2 * PASSAGE_TOKENS
    settings = AskSettings(method=SnapKV(budget=budget, window=WINDOW), max_tokens=4, threads=2, sources=False, read="fast",
                           fast=FastSettings(choose="bm25", opening=1, opening_for="document"))
    read = {}
    for question in ("Which law governs this?", "Which law governs this agreement?"):
        conversation = Conversation(tiny_model, "tiny", DOCUMENT, settings)
        passages = conversation._text.passages
        done, pruned = _asked(conversation, question)
        window_start = done.stats.prompt_tokens - WINDOW
        read[question] = done.stats.read, pruned.kept_positions[:-WINDOW], window_start
    about_law = [index for index, text in enumerate(passages.texts) if "governing law" in text]
    most = max(about_law, key=lambda index: passages.texts[index].count("governing law"))
    label, kept, window_start = read["Which law governs this?"]
    assert (label, kept) == ("bm25, 2 passages", tuple(passages.tokens_of(np.array(about_law), window_start).tolist()))
    label, kept, window_start = read["Which law governs this agreement?"]
    assert (label, kept) == ("bm25 and the opening, 2 passages", tuple(passages.tokens_of(np.array([0, most]), window_start).tolist()))
    assert 0 not in about_law and most != 0
    with pytest.raises(SettingsError, match="unknown fast reading opening_for 'questions'"):
        FastSettings(opening=1, opening_for="questions")


def test_a_question_sharing_no_word_with_the_document_is_read_as_the_attention_chooses(tiny_model) -> None:
    conversation = _conversation(tiny_model)
    passages = conversation._text.passages
    done, pruned = _asked(conversation, "What is it, and why?")
    assert done.stats.read == "fast 1/2 layers, 1 passages"  # the model's own first layer chose, not BM25
    read = np.isin(np.arange(passages.n_tokens), pruned.kept_positions)
    assert read[passages.always].all() and 0 < read.sum() - len(passages.always) <= BUDGET


@pytest.mark.parametrize("text", ["... !!! ??? ,,, ;;; " * 60, "1 2 3 " * 200, "a " * 600, "\U0001F600 \U0001F680. " * 120],
                         ids=["punctuation", "numbers", "stop-words", "emoji"])
def test_a_document_with_no_word_bm25_indexes_is_read_as_the_attention_chooses(tiny_model, text: str) -> None:
    document = Document(path=Path("wordless.txt"), kind="text", text=text)
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), max_tokens=4, threads=2, sources=False,
                           read="retrieval")
    conversation = Conversation(tiny_model, "tiny", document, settings)
    passages = conversation._text.passages
    np.testing.assert_array_equal(passages.bm25("How much is item 7?"), np.zeros(len(passages.starts)))
    done, pruned = _asked(conversation, "How much is item 7?")
    assert done.stats.read.startswith("fast 1/2 layers, ")  # the cheap pass's attention chose, as for no shared word
    assert 0 < len(pruned.kept_positions) < passages.n_tokens


def test_a_passages_attention_is_the_mean_score_of_its_read_tokens() -> None:
    passages = Passages(np.array([2, 5, 9]), np.array([5, 9, 12]), ("a", "b", "c"), np.array([0, 1, 12]), 13,
                        np.array([2, 2, 2]), np.array([2, 2, 2]))  # no pages: no marks
    origins = np.array([0, 1, 2, 3, 4, 9, 10, 12])
    scores = np.array([9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0])
    np.testing.assert_array_equal(passages.attention(scores, origins), [2.0, -np.inf, 5.0])


@pytest.mark.parametrize("read", ["retrieval", "fast"])
def test_a_document_shorter_than_the_reading_is_read_whole(tiny_model, read: str) -> None:
    document = Document(path=Path("short.txt"), kind="text", text="Note 0 is on governing law.")
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), max_tokens=4, threads=2, sources=False, read=read)
    conversation = Conversation(tiny_model, "tiny", document, settings)
    try:
        list(conversation.open("Which law governs this?"))
        done = list(route.answer(conversation, "Which law governs this?"))[-1]
    finally:
        conversation.close()
    assert done.stats.read == "full" and done.stats.kept_tokens == done.stats.prompt_tokens


PAGED = Document.from_pages(Path("topics.pdf"), "pdf", ["\n\n".join(_paragraph(topic) for topic in TOPICS[i : i + 3])
                                                        for i in range(0, len(TOPICS), 3)])  # four pages, three topics each


def test_a_paged_documents_passages_each_hold_one_pages_sentences_after_its_mark(tiny_model) -> None:
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), max_tokens=4, threads=2, sources=False, read="retrieval")
    conversation = Conversation(tiny_model, "tiny", PAGED, settings)
    passages, pieces = conversation._text.passages, tiny_model.pieces_text(conversation.document_tokens)
    assert "".join(passages.texts) == PAGED.text  # the marks are in no passage
    marks = ["".join(pieces[start:end]) for start, end in zip(passages.mark_starts.tolist(), passages.mark_ends.tolist())]
    pages = [PAGED.page_at(int(conversation._text.token_ranges[0][start])) for start in passages.starts.tolist()]
    assert marks == [f"[p. {page}]\n" for page in pages] and sorted(set(pages)) == [1, 2, 3, 4]
    starts = conversation._text.token_ranges[0][passages.starts].tolist()
    lasts = [start + len(text.rstrip()) - 1 for start, text in zip(starts, passages.texts)]
    assert [PAGED.page_at(last) for last in lasts] == pages  # no passage runs on into the next page
    chosen = np.array([int(np.argmax(passages.bm25("Which law governs this?")))])
    read = passages.tokens_of(chosen, passages.n_tokens)
    inside = read[(read >= passages.mark_starts[0]) & (read < passages.ends[-1])]
    assert "".join(pieces[i] for i in inside) == "[p. 1]\n" + passages.texts[chosen[0]]  # governing law is on page 1


def test_a_pages_mark_holds_none_of_the_documents_text(tiny_model) -> None:
    from kvchat.engine.prompt_text import prompt_text

    held = prompt_text(PAGED)
    assert held.text.startswith("[p. 1]\nNote 0 is on orchard apples.") and held.text.count("[p. ") == 4
    assert held.text.replace("[p. 2]\n", "").replace("[p. 3]\n", "").replace("[p. 4]\n", "") == "[p. 1]\n" + PAGED.text
    conversation = Conversation(tiny_model, "tiny", PAGED, AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), threads=2))
    starts, ends = conversation._text.token_ranges
    pieces = tiny_model.pieces_text(conversation.document_tokens)
    in_marks = np.flatnonzero(held.touches_mark(*conversation._text._prompt_ranges))
    assert "".join(pieces[i] for i in in_marks) == "".join(f"[p. {n}]\n" for n in range(1, 5))
    assert (starts[in_marks] == ends[in_marks]).all()  # no source or kept span can name a mark
    text_tokens = np.flatnonzero(ends > starts)
    assert "".join(pieces[i] for i in text_tokens) == PAGED.text


def test_in_a_bundle_each_chosen_passage_is_read_after_its_documents_name_and_page(tiny_model) -> None:
    from kvchat.documents import bundle
    from kvchat.documents.model import Page
    from kvchat.engine.prompt_text import prompt_text

    notes = Document(Path("notes.txt"), "text", _paragraph("harbour ferries"), [Page(1, 0, len(_paragraph("harbour ferries")))])
    pair = bundle([PAGED, notes])
    held = prompt_text(pair)
    assert [line for line in held.text.split("\n") if line.startswith("[")] == [
        "[topics.pdf, p. 1]", "[topics.pdf, p. 2]", "[topics.pdf, p. 3]", "[topics.pdf, p. 4]", "[notes.txt]"]
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=WINDOW), max_tokens=4, threads=2, sources=False, read="retrieval")
    conversation = Conversation(tiny_model, "tiny", pair, settings)
    passages, pieces = conversation._text.passages, tiny_model.pieces_text(conversation.document_tokens)
    chosen = np.array([int(np.argmax(passages.bm25("Which law governs this?"))),
                       len(passages.starts) - 1])  # governing law on page 1 of the PDF; the notes' last passage
    read = passages.tokens_of(chosen, passages.n_tokens)
    inside = "".join(pieces[i] for i in read[(read >= passages.mark_starts[0]) & (read < passages.ends[-1])])
    assert inside == "[topics.pdf, p. 1]\n" + passages.texts[chosen[0]] + "[notes.txt]\n" + passages.texts[chosen[1]]


def test_a_plain_text_document_is_held_as_it_is() -> None:
    from kvchat.engine.prompt_text import prompt_text

    held = prompt_text(DOCUMENT)
    assert held.text == DOCUMENT.text and held.to_document is None and not held.touches_mark(np.array([0]), np.array([5])).any()


def test_bm25s_is_imported_without_jax_and_jax_still_imports_afterwards(tmp_path: Path) -> None:
    """bm25s runs JAX at import where it is installed (on a GPU machine, 75 % of the GPU's memory);
    a JAX planted on the path records each import of it."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text(
        "import pathlib\npathlib.Path(__file__).parent.parent.joinpath('imported').touch()\n", encoding="utf-8")
    (tmp_path / "jax" / "lax.py").write_text("def top_k(scores, k):\n    return scores[:k], list(range(k))\n", encoding="utf-8")
    script = ("import sys\nimport kvchat.engine.text.passages as p\n"
              "print(p.bm25s.selection.JAX_IS_AVAILABLE, 'jax' in sys.modules)\n"
              "import jax.lax\nprint(jax.lax.__name__)\n")
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_DIR), *inherited])}
    run = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", "jax.lax"]  # bm25s chose numpy; the program's own import works
    assert (tmp_path / "imported").exists()  # by that import alone: kvchat's never ran it
