"""A reading the question chooses: the document cut into passages, BM25 and the cheap pass's
attention ranking them, and the model reading the chosen ones alone (tiny model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation
from kvchat.engine.reading.passages import PASSAGE_TOKENS, Passages
from kvchat.engine.settings import FastSettings
from kvchat.engine.answering import route
from kvchat.events import Done, Pruned
from kvchat.policy import SnapKV

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


def test_a_question_sharing_no_word_with_the_document_is_read_as_the_attention_chooses(tiny_model) -> None:
    conversation = _conversation(tiny_model)
    passages = conversation._text.passages
    done, pruned = _asked(conversation, "What is it, and why?")
    assert done.stats.read == "fast 1/2 layers, 1 passages"  # the model's own first layer chose, not BM25
    read = np.isin(np.arange(passages.n_tokens), pruned.kept_positions)
    assert read[passages.always].all() and 0 < read.sum() - len(passages.always) <= BUDGET


def test_a_passages_attention_is_the_mean_score_of_its_read_tokens() -> None:
    passages = Passages(np.array([2, 5, 9]), np.array([5, 9, 12]), ("a", "b", "c"), np.array([0, 1, 12]), 13)
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
