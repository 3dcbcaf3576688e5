"""A passage bank on the tiny model: what a later question holds after loading chosen passages
(cells, positions, origins), that a passage loaded from the bank as read gives the logits of the
same passage read fresh at its place after the opening, and that the bank a conversation holds and
saves is packed, within its blocks' rounding of that."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation
from kvchat.engine.answering import route
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.kvcache.store import StateStore
from kvchat.engine.reading.passage_bank import HELD_AS, PassageBank, load_chosen, opening_end, read_bank
from kvchat.engine.text.passages import Passages
from kvchat.events import Notice, Progress, Pruned
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits

TOPICS = ["orchard apples", "harbour ferries", "governing law", "violin strings", "glacier ice", "copper mines",
          "desert owls", "paper lanterns", "river otters", "clock towers", "salt marshes", "tea gardens"]
PAGED = Document.from_pages(Path("topics.pdf"), "pdf", [
    "\n\n".join(" ".join(f"Note {n} is on {topic}." for n in range(7)) for topic in TOPICS[i : i + 3])
    for i in range(0, len(TOPICS), 3)])  # four pages, three topics each
# What moving cells costs the logits: llama.cpp re-rotates the f16 keys of every shift (a move
# 1,000 positions up and back changes the tiny model's logits by 1.4e-3 of their 4.5).
SHIFT_NOISE = 3e-3
QUESTION = [5, 9, 13, 17, 21, 25, 29, 33]  # token ids read after the passages: a question's stand-in


def _prompt(tiny_model) -> tuple[list[int], Passages]:
    settings = AskSettings(method=SnapKV(budget=256, window=16), threads=2, read="retrieval")
    conversation = Conversation(tiny_model, "tiny", PAGED, settings)
    return conversation.document_tokens, conversation._text.passages


def _answered_from_its_bank(tiny_model, settings: AskSettings, question: str, states: DocumentStates | None = None):
    """A conversation about PAGED that reads its bank (and saves it in `states`) and answers
    `question` from it; the conversation, closed, and the answer's events."""
    conversation = Conversation(tiny_model, "tiny", PAGED, settings, states=states)
    try:
        list(conversation.open(question))
        list(conversation.read_bank())
        return conversation, list(route.answer(conversation, question))
    finally:
        conversation.close()


def _cache(model) -> KvCache:
    return KvCache(LlamaContext(model, ContextSettings(n_ctx=4096, n_batch=256, threads=2)))


@pytest.fixture(scope="module")
def banked(tiny_model) -> tuple[list[int], Passages, PassageBank, list[Progress]]:
    tokens, passages = _prompt(tiny_model)
    reading = read_bank(tiny_model, ContextSettings(n_ctx=4096, n_batch=256, threads=2), tokens, passages)
    progress: list[Progress] = []
    while True:
        try:
            progress.append(next(reading))
        except StopIteration as finished:
            return tokens, passages, finished.value, progress


def test_a_bank_reads_every_token_of_the_document_once_and_keeps_each_piece(banked) -> None:
    tokens, passages, bank, progress = banked
    first = opening_end(passages)
    in_text = int((passages.ends - passages.starts).sum())
    in_marks = sum(end - start for start, end in bank.marks)
    assert progress[-1].done == first + in_marks + in_text == passages.ends[-1]  # the closing template is read by the question
    assert len(bank.passages) == len(passages.starts) and len(bank.marks) == 4  # one mark a page


def test_a_follow_up_holds_the_opening_and_the_chosen_passages_with_their_marks_at_consecutive_positions(
    tiny_model, banked
) -> None:
    tokens, passages, bank, _ = banked
    pages = np.searchsorted(np.unique(passages.mark_starts), passages.mark_starts)
    chosen = np.array([1, 2, int(np.flatnonzero(pages == 2)[0])])  # two of page 1, one of page 3
    cache = _cache(tiny_model)
    with cache.ctx:
        held = load_chosen(cache, bank, passages, chosen, tokens)
        first = opening_end(passages)
        marks = [np.arange(passages.mark_starts[i], passages.mark_ends[i]) for i in (1, chosen[2])]
        expected = np.concatenate([np.arange(first), marks[0], *(np.arange(passages.starts[i], passages.ends[i]) for i in (1, 2)),
                                   marks[1], np.arange(passages.starts[chosen[2]], passages.ends[chosen[2]])])
        np.testing.assert_array_equal(held, expected)  # the page 1 mark once, in document order
        np.testing.assert_array_equal(cache.origins, expected)
        np.testing.assert_array_equal(cache.positions, np.arange(len(expected)))
        np.testing.assert_array_equal(cache.ctx.positions(0), np.arange(len(expected)))  # llama.cpp's cells agree
        np.testing.assert_array_equal(cache.tokens, np.asarray(tokens)[expected])
        cache.decode(QUESTION, want_logits=True)  # a follow-up reads only what follows the passages
        assert cache.cells == len(expected) + len(QUESTION) and cache.next_pos == len(expected) + len(QUESTION)


def test_a_passage_loaded_from_the_bank_gives_the_logits_of_the_passage_read_fresh_at_its_place(tiny_model, banked) -> None:
    tokens, passages, bank, _ = banked
    index = 4
    mark, span = (passages.mark_starts[index], passages.mark_ends[index]), (passages.starts[index], passages.ends[index])
    fresh = _cache(tiny_model)
    with fresh.ctx:  # the opening, the passage's mark and the passage, read at consecutive positions from 0
        for start, end in ((0, opening_end(passages)), mark, span):
            fresh.decode(tokens[start:end])
        fresh.decode(QUESTION, want_logits=True)
        expected = last_logits(fresh.ctx)
    logits = []
    for chosen in (index, index + 1):
        loaded = _cache(tiny_model)
        with loaded.ctx:
            load_chosen(loaded, bank, passages, np.array([chosen]), tokens)
            loaded.decode(QUESTION, want_logits=True)
            logits.append(last_logits(loaded.ctx))
    np.testing.assert_allclose(logits[0], expected, atol=SHIFT_NOISE)
    assert np.abs(logits[1] - expected).max() > 100 * SHIFT_NOISE  # another passage is no near miss


def test_a_conversation_holds_and_saves_its_bank_packed_and_its_passages_answer_within_the_blocks_rounding(tiny_model, banked,
                                                                                                           tmp_path: Path) -> None:
    tokens, passages, bank, _ = banked
    settings = AskSettings(method=SnapKV(budget=256, window=16), max_tokens=4, threads=2, sources=False, read="retrieval")
    states = DocumentStates(StateStore(tmp_path), "sha-of-the-tiny-model", "tiny")
    conversation, _ = _answered_from_its_bank(tiny_model, settings, "Which law governs this?", states)
    held = conversation.bank
    k_blocks, v_blocks = (34, 18) if HELD_AS == ("q8_0", "q4_0") else pytest.fail(f"blocks of {HELD_AS}")
    assert held.packed and len(held.passages) == len(bank.passages)
    assert (k_blocks + v_blocks) / 128 < held.n_bytes / bank.n_bytes < (k_blocks + v_blocks) / 128 + 0.05  # the blocks and the cell tables
    (entry,) = states.store.entries()
    assert held.n_bytes < entry.size < held.n_bytes + 4096  # saved as held: the index and the store's header beside
    logits = []
    for held_as in (bank, held):  # the passage as read, and as held
        loaded = _cache(tiny_model)
        with loaded.ctx:
            load_chosen(loaded, held_as, passages, np.array([4]), tokens)
            loaded.decode(QUESTION, want_logits=True)
            logits.append(last_logits(loaded.ctx))
    assert 0 < np.abs(logits[1] - logits[0]).max() < 0.2 * np.abs(logits[0]).max()  # rounded, no more (llama/packed.py's tests)


def test_a_question_read_fast_after_the_bank_loads_its_passages_and_reads_only_the_rest(tiny_model) -> None:
    settings = AskSettings(method=SnapKV(budget=256, window=16), max_tokens=4, threads=2, sources=False, read="retrieval")
    conversation = Conversation(tiny_model, "tiny", PAGED, settings)
    question = "Which law governs this?"
    try:
        list(conversation.open(question))
        fresh = list(route.answer(conversation, question))
        list(conversation.read_bank())
        conversation.reset()  # the same question again, not a follow-up
        banked = list(route.answer(conversation, question))
    finally:
        conversation.close()
    (fresh_pruned,), (banked_pruned,) = ([event for event in events if isinstance(event, Pruned)] for events in (fresh, banked))
    assert banked_pruned.kept_positions == fresh_pruned.kept_positions  # the same tokens, in the same cells
    read = np.asarray(fresh_pruned.kept_positions)
    passages = conversation._text.passages
    loaded = read[read < passages.ends[-1]]  # the opening, the chosen passages and their marks
    assert banked[-1].stats.read == f"{fresh[-1].stats.read}, {len(loaded):,} loaded"
    second_pass = [event for event in banked if isinstance(event, Progress)][-1]
    assert second_pass.total == len(read) - len(loaded) - settings.method.window  # read: the closing template and the question's start


def test_a_follow_up_reads_only_its_question_where_the_window_would_reach_into_the_document(tiny_model) -> None:
    window = 96  # longer than the question's part of the prompt: it would reach back into the last passage
    settings = AskSettings(method=SnapKV(budget=256, window=window), max_tokens=4, threads=2, sources=False, read="retrieval")
    question = "Tea gardens?"
    conversation, events = _answered_from_its_bank(tiny_model, settings, question)
    passages = conversation._text.passages
    n_prompt, n_document = len(conversation.prompt_tokens), len(conversation.document_tokens)
    assert passages.starts[-1] < n_prompt - window < passages.ends[-1]
    (pruned,) = [event for event in events if isinstance(event, Pruned)]
    read = np.asarray(pruned.kept_positions)
    loaded = read[read < passages.ends[-1]]
    assert set(range(passages.starts[-1], passages.ends[-1])) <= set(loaded.tolist())  # the last passage, tea gardens, loaded whole
    assert events[-1].stats.read.endswith(f", {len(loaded):,} loaded")
    np.testing.assert_array_equal(read[len(loaded):], np.arange(passages.ends[-1], n_prompt))  # then the rest of the prompt, in order
    progress = [event for event in events if isinstance(event, Progress)]
    assert [event.total for event in progress] == [n_prompt, n_document - passages.ends[-1]]  # read before the question: the closing template


def test_a_saved_bank_is_loaded_by_a_later_conversation_and_answers_as_the_bank_it_saved(tiny_model, tmp_path: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=256, window=16), max_tokens=4, threads=2, sources=False, read="retrieval")
    states = DocumentStates(StateStore(tmp_path), "sha-of-the-tiny-model", "tiny")
    question = "Which law governs this?"
    answers = []
    for reads_bank in (True, False):  # the second conversation, as a later process, finds the bank saved
        conversation = Conversation(tiny_model, "tiny", PAGED, settings, states=states)
        try:
            list(conversation.open(question))
            if reads_bank:
                list(conversation.read_bank())
            answers.append(list(route.answer(conversation, question)))
        finally:
            conversation.close()
    (entry,) = states.store.entries()
    assert entry.header.document == "topics.pdf (passages)" and entry.size > sum(len(piece) for piece in conversation.bank.passages)
    assert answers[1][-1].stats.read == answers[0][-1].stats.read and answers[1][-1].stats.read.endswith(" loaded")
    assert answers[1][-1].answer == answers[0][-1].answer


def test_a_bank_payload_gives_back_every_piece_and_refuses_what_is_not_one(banked) -> None:
    _, _, bank, _ = banked
    payload, index_bytes = bank.to_payload()
    again = PassageBank.from_payload(payload)
    assert bytes(again.opening) == bytes(bank.opening) and list(again.marks) == list(bank.marks)
    assert [bytes(piece) for piece in again.passages] == [bytes(piece) for piece in bank.passages]
    assert bytes(payload[index_bytes : index_bytes + len(bank.opening)]) == bytes(bank.opening)  # the pieces follow the index
    packed = PassageBank.from_payload(bank.packed_as("q8_0", "q8_0").to_payload()[0])
    assert packed.packed and len(packed.to_payload()[0]) < 0.56 * len(payload)
    assert bytes(packed.passage_state(3))[:64] == bytes(bank.passages[3])[:64]  # the same cells, f16 again
    for payload in (b"", b"\x05\x00\x00\x00{}", b"\x02\x00\x00\x00{}" + b"x" * 8, payload[:-1]):
        with pytest.raises(ValueError, match="not a passage bank|runs past"):
            PassageBank.from_payload(payload)


def test_a_bank_piece_the_disk_changed_is_caught_as_it_loads_and_the_bank_is_discarded(tiny_model, tmp_path: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=256, window=16), max_tokens=4, threads=2, sources=False, read="retrieval")
    states = DocumentStates(StateStore(tmp_path), "sha-of-the-tiny-model", "tiny")
    question = "Which law governs this?"
    _, fresh = _answered_from_its_bank(tiny_model, settings, question, states)
    (entry,) = states.store.entries()
    assert entry.header.checked_bytes is not None and entry.header.checked_bytes < entry.header.payload_bytes / 100  # the index only
    opening_at = entry.path.stat().st_size - entry.header.payload_bytes + entry.header.checked_bytes
    with entry.path.open("r+b") as file:  # one byte of the opening's piece, which every question loads
        file.seek(opening_at + 100)
        byte = file.read(1)
        file.seek(opening_at + 100)
        file.write(bytes([byte[0] ^ 0xFF]))
    later = Conversation(tiny_model, "tiny", PAGED, settings, states=states)
    try:
        list(later.open(question))
        events = list(route.answer(later, question))
    finally:
        later.close()
    notices = [event.text for event in events if isinstance(event, Notice)]
    assert len(notices) == 1 and "does not match its checksum" in notices[0] and not entry.path.exists()
    assert events[-1].stats.read == fresh[-1].stats.read.rsplit(", ", 1)[0]  # read, not loaded: the passages the bank held
    assert events[-1].stats.loaded_tokens == 0
