"""Several documents read block-wise on the tiny model (ComposedReading, which no front end uses:
it measured worse): each document's reading is made (and saved) on its own and the readings are
put together by shifting positions; the result equals a block-wise reading made in one context,
and a combination already read reads nothing again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.inspect_helpers import last_logits
from kvchat.documents import Document, bundle
from kvchat.documents.bundle import document_names, document_starts
from kvchat.engine import AskSettings, ComposedReading, Conversation
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.kvcache.store import StateStore
from kvchat.events import Notice, Progress
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.policy import SnapKV

SETTINGS = AskSettings(method=SnapKV(budget=96, window=16), max_tokens=6, threads=2)
TWO_SEQUENCES = ContextSettings(n_ctx=512, n_batch=128, n_seq_max=2, kv_unified=True)


def test_a_reading_appended_equals_the_same_block_read_in_place(tiny_model) -> None:
    rng = np.random.default_rng(3)
    prefix, first, second, end = ([int(t) for t in rng.integers(10, 200, n)] for n in (20, 37, 29, 5))
    with LlamaContext(tiny_model, TWO_SEQUENCES) as ctx:  # the block read in place, seeing only the prefix
        ctx.decode(prefix + first, 0, want_logits=False)
        ctx.copy(0, 1, 0, len(prefix))
        ctx.decode(second, len(prefix), seq=1, want_logits=False)
        ctx.shift(1, len(prefix), -1, len(first))
        ctx.copy(1, 0, -1, -1)
        ctx.remove(1, -1, -1)
        ctx.decode(end, len(prefix + first + second))
        expected = last_logits(ctx)
    with LlamaContext(tiny_model, ContextSettings(n_ctx=512, n_batch=128)) as ctx:  # the second read on its own
        ctx.decode(prefix + second, 0, want_logits=False)
        alone = ctx.state_bytes(0)
    cache = KvCache(LlamaContext(tiny_model, TWO_SEQUENCES))
    try:
        cache.decode(prefix + first)
        cache.append_reading(alone, len(prefix), second)
        assert np.array_equal(cache.positions, np.arange(len(prefix + first + second)))
        assert np.array_equal(cache.tokens, prefix + first + second) and cache.next_pos == len(prefix + first + second)
        cache.decode(end, want_logits=True)
        np.testing.assert_allclose(last_logits(cache.ctx), expected, atol=1e-4)
        with LlamaContext(tiny_model, ContextSettings(n_ctx=512, n_batch=128)) as plain:
            plain.decode(prefix + first + second + end, 0)
            assert np.abs(last_logits(plain) - expected).max() > 1e-2  # block-wise is not the concatenation
    finally:
        cache.ctx.close()


@pytest.fixture
def states(tmp_path: Path, tiny_model_path: Path) -> DocumentStates:
    return DocumentStates(StateStore(tmp_path / "states", 2**30), "tiny-sha", "tiny").for_settings(SETTINGS)


def _document(name: str, sentence: str, count: int) -> Document:
    return Document.from_pages(Path(name), "text", [" ".join(sentence.format(i=i) for i in range(count))])


BOXES = _document("boxes.txt", "Box {i} holds code {i}7.", 60)
LEDGER = _document("ledger.txt", "Page {i} of the ledger lists {i}3 crates.", 40)
NOTES = _document("notes.txt", "Note {i}: the radio failed on day {i}.", 30)


def _open(model, document: Document, states: DocumentStates) -> tuple[Conversation, list]:
    conversation = Conversation(model, "tiny", document, SETTINGS, states=states, reading=ComposedReading())
    return conversation, list(conversation.open())


def test_each_document_is_saved_on_its_own_and_a_combination_read_before_is_only_loaded(tiny_model, states) -> None:
    first, events = _open(tiny_model, bundle([BOXES, LEDGER]), states)
    try:
        assert first.run.loaded_upto == 0 and len(states.store.entries()) == 2  # one reading per document
        assert np.array_equal(first.run.cache.positions, np.arange(len(first.document_tokens)))
        assert [event.done for event in events if isinstance(event, Progress)][-1] == sum(map(len, first._runs[:-1])) + len(first._runs[0])
        done = list(first.ask("What does box 3 hold?"))[-1]
        assert done.stats.read_tokens == done.stats.prompt_tokens and done.stats.kept_tokens <= 96
    finally:
        first.close()
    again, events = _open(tiny_model, bundle([BOXES, LEDGER]), states)
    try:
        suffix = len(again.document_tokens) - again.run.loaded_upto
        assert 0 < suffix < 20  # only the end that follows the documents is read
        assert not [event for event in events if isinstance(event, Progress)]
        assert [event.text for event in events if isinstance(event, Notice)] == [
            f"loaded the saved reading of boxes.txt ({len(again._runs[0] + again._runs[1]):,} tokens)",
            f"loaded the saved reading of ledger.txt ({len(again._runs[0] + again._runs[2]):,} tokens)",
        ]
    finally:
        again.close()
    third, events = _open(tiny_model, bundle([LEDGER, NOTES]), states)  # ledger.txt first now: loaded all the same
    try:
        assert len(states.store.entries()) == 3 and third.run.loaded_upto == len(third._runs[0] + third._runs[1])
        assert [event.text for event in events if isinstance(event, Notice)] == [
            f"loaded the saved reading of ledger.txt ({len(third._runs[0] + third._runs[1]):,} tokens)"]
        assert third._runs[1] == again._runs[2]  # the same tokens wherever the document stands
    finally:
        third.close()


def test_by_default_several_documents_are_read_as_one_text(tiny_model, states) -> None:
    conversation = Conversation(tiny_model, "tiny", bundle([BOXES, LEDGER]), SETTINGS, states=states)
    try:
        list(conversation.open())
        assert len(states.store.entries()) == 1 and conversation.run.cache.ctx.settings.n_seq_max == 1
    finally:
        conversation.close()
    block_wise, _ = _open(tiny_model, bundle([LEDGER, NOTES]), states)  # saves ledger.txt's reading alone
    block_wise.close()
    one_text = Conversation(tiny_model, "tiny", bundle([LEDGER, BOXES]), SETTINGS, states=states)
    try:  # ledger.txt's own reading is the beginning of this one text: loaded, and said to be a part
        notices = [event.text for event in one_text.open() if isinstance(event, Notice)]
        first = len(one_text._runs[0] + one_text._runs[1])
        assert notices == [f"loaded a saved reading of the first {first:,} of {len(one_text.document_tokens):,} "
                           "tokens of ledger.txt + boxes.txt"] and one_text.run.loaded_upto == first
    finally:
        one_text.close()


def test_a_file_given_twice_counts_once_and_two_files_of_one_name_are_told_apart() -> None:
    assert bundle([BOXES, BOXES]) is BOXES
    other = Document.from_pages(Path("boxes.txt"), "text", ["Another boxes.txt, uploaded under the same name."])
    both = bundle([BOXES, other, LEDGER])
    assert document_names(both) == ["boxes.txt (1)", "boxes.txt (2)", "ledger.txt"]
    assert [both.text[start:].split("\n", 1)[0] for start in document_starts(both)] == [
        "=== boxes.txt (1) ===", "=== boxes.txt (2) ===", "=== ledger.txt ==="]
