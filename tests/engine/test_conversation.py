"""Conversations on the tiny model: what each selection keeps for follow-up questions."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.documents import Document
from kvchat.engine import SELECTIONS, AskSettings, Conversation, Turn, selection_named
from kvchat.engine.answering import route
from kvchat.errors import PromptTooLongError, SettingsError
from kvchat.events import Done, Notice, Pruned
from kvchat.policy import SnapKV

SETTINGS = AskSettings(method=SnapKV(budget=96, window=16), max_tokens=6, threads=2)


@pytest.fixture
def conversation_factory(tiny_model, tmp_path):
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(60))
    document = Document(path=Path("boxes.txt"), kind="text", text=text)
    made = []

    def make(selection: str) -> Conversation:
        conversation = Conversation(tiny_model, "tiny", document, replace(SETTINGS, select=selection))
        list(conversation.open())
        made.append(conversation)
        return conversation

    yield make
    for conversation in made:
        conversation.close()


def ask(conversation: Conversation, question: str) -> tuple[Done, list[Pruned]]:
    events = list(route.answer(conversation, question))
    return events[-1], [e for e in events if isinstance(e, Pruned)]


@pytest.mark.parametrize("name", SELECTIONS)
def test_every_selection_answers_follow_ups_without_reading_the_document_again(conversation_factory, name) -> None:
    conversation = conversation_factory(name)
    n_document = len(conversation.document_tokens)
    first, _ = ask(conversation, "What is the code for box 3?")
    second, _ = ask(conversation, "And the code for box 50?")
    assert [first.stats.method, second.stats.method] == ["snapkv", "snapkv"]  # what chose the kept cells
    assert first.stats.loaded_tokens == 0 and first.stats.read_tokens == first.stats.prompt_tokens
    assert second.stats.loaded_tokens >= n_document  # the follow-up started from the reading
    assert second.stats.read_tokens == second.stats.prompt_tokens - second.stats.loaded_tokens
    if name != "reuse":  # reuse also keeps the first prompt's tokens the second one shares
        assert second.stats.loaded_tokens == n_document
    assert second.stats.kept_tokens < second.stats.prompt_tokens
    assert [turn.answer for turn in conversation.turns] == [first.answer, second.answer]


def test_an_unknown_selection_is_refused_with_the_choices() -> None:
    with pytest.raises(SettingsError, match="unknown selection 'everything'") as raised:
        selection_named("everything")
    assert raised.value.hint == "use one of: question, document, reuse"


def test_per_question_selection_pins_earlier_turns(conversation_factory) -> None:
    conversation = conversation_factory("question")
    first, (first_pruned,) = ask(conversation, "What is the code for box 3?")
    assert first_pruned.kept_tokens == 96
    second, (second_pruned,) = ask(conversation, "And the code for box 50?")
    n_document = len(conversation.document_tokens)
    first_turn = range(n_document, first.stats.prompt_tokens)  # the first question, now an earlier turn
    assert set(first_turn) <= set(second_pruned.kept_positions)
    assert second_pruned.kept_tokens > 96
    assert [turn.answer for turn in conversation.turns] == [first.answer, second.answer]


def test_reuse_continues_on_the_first_kept_set(conversation_factory) -> None:
    conversation = conversation_factory("reuse")
    first, pruned = ask(conversation, "What is the code for box 3?")
    assert len(pruned) == 1
    second, pruned = ask(conversation, "And the code for box 50?")
    assert pruned == []  # no new selection: the first question's kept set carries on
    new_tokens = second.stats.prompt_tokens - first.stats.prompt_tokens
    assert second.stats.kept_tokens == first.stats.kept_tokens + new_tokens


def test_query_agnostic_selects_once(conversation_factory) -> None:
    conversation = conversation_factory("document")
    first, pruned_first = ask(conversation, "What is the code for box 3?")
    second, pruned_second = ask(conversation, "And the code for box 50?")
    assert pruned_first == pruned_second == []
    n_question = first.stats.prompt_tokens - len(conversation.document_tokens)
    assert first.stats.kept_tokens == 96 + n_question
    assert second.stats.kept_tokens < second.stats.prompt_tokens


def test_reset_starts_over(conversation_factory) -> None:
    conversation = conversation_factory("question")
    first, _ = ask(conversation, "What is the code for box 3?")
    ask(conversation, "And box 4?")
    conversation.reset()
    again, _ = ask(conversation, "What is the code for box 3?")
    assert again.answer == first.answer and again.stats.prompt_tokens == first.stats.prompt_tokens


def test_follow_up_ttft_does_not_count_the_reading(conversation_factory) -> None:
    conversation = conversation_factory("question")
    conversation._reading_s = 1000.0  # as if reading had taken long
    first, _ = ask(conversation, "What is the code for box 3?")
    second, _ = ask(conversation, "And box 4?")
    assert first.stats.ttft_s >= 1000.0 and second.stats.ttft_s < 100.0


def test_a_document_longer_than_the_context_is_read_and_answered_streamed(tiny_model) -> None:
    """The TUI's path: its settings (any method but a streaming one) come with every question."""
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(160))
    document = Document(path=Path("boxes.txt"), kind="text", text=text)
    conversation = Conversation(tiny_model, "tiny", document, SETTINGS)
    try:
        assert len(conversation.document_tokens) > tiny_model.shape.n_ctx_train
        assert conversation.settings.method.name == "snapstream" and conversation.settings.method.budget == 96
        notices = [event.text for event in conversation.open() if isinstance(event, Notice)]
        assert notices == [f"the document is {len(conversation.document_tokens):,} tokens, more than the 4,096 the "
                           "model was trained on: reading it streamed (snapstream), keeping 96 entries"]
        done = list(route.answer(conversation, "What is the code for box 3?", settings=SETTINGS))[-1]
        assert done.stats.method == "snapstream" and done.stats.kept_tokens <= 96
    finally:
        conversation.close()


def test_a_named_method_is_kept_and_a_long_document_refused(tiny_model) -> None:
    document = Document(path=Path("boxes.txt"), kind="text", text="Box 3 holds code 1021. " * 400)
    with pytest.raises(PromptTooLongError, match="the model was trained on 4,096"):
        Conversation(tiny_model, "tiny", document, replace(SETTINGS, method_named=True))


def test_a_system_prompt_is_part_of_the_documents_prompt_and_of_every_question(tiny_model) -> None:
    document = Document(path=Path("boxes.txt"), kind="text", text=" ".join(f"Box {i} holds {i * 3}." for i in range(20)))
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, threads=2)
    own = Conversation(tiny_model, "tiny", document, settings)
    french = Conversation(tiny_model, "tiny", document, replace(settings, system="Answer in French."))
    try:
        told = "".join(tiny_model.pieces_text(french.document_tokens))
        assert "Answer in French." in told and "keep the answer short" not in told
        assert "keep the answer short" in "".join(tiny_model.pieces_text(own.document_tokens))
        list(french.open())
        list(route.answer(french, "What does box 3 hold?"))
        assert french.prompt_tokens[: len(french.document_tokens)] == french.document_tokens
    finally:
        own.close()
        french.close()
    with pytest.raises(SettingsError, match="`system` should hold some text"):
        AskSettings(system="  ")


LONG_QUESTION = "why " * 2500  # 10,000 characters: 10,021 tokens of the question's part on the tiny model


def test_a_long_question_beside_a_document_is_refused_before_any_context_is_made(tiny_model, contexts_made) -> None:
    """The CLI's path (open with the question, then ask): nothing is read for a question that
    cannot fit; before, the context was grown to 11,520 cells for it."""
    document = Document(path=Path("boxes.txt"), kind="text", text="Box 3 holds code 1021. " * 20)
    conversation = Conversation(tiny_model, "tiny", document, SETTINGS)
    try:
        with pytest.raises(PromptTooLongError) as raised:
            list(conversation.open(LONG_QUESTION))
        assert raised.value.message == ("the question is 10,021 tokens; a question may take at most 1,024 "
                                        "(a quarter of the 4,096 the model was trained on)")
        assert raised.value.hint == "ask a shorter question: long text belongs in the document"
        assert contexts_made == []
    finally:
        conversation.close()


def test_a_long_question_after_the_reading_never_grows_the_context_past_the_trained_one(tiny_model, contexts_made) -> None:
    """The chat's path (the document read before any question): the question is refused in
    select(), and the conversation answers the next one."""
    document = Document(path=Path("boxes.txt"), kind="text", text="Box 3 holds code 1021. " * 20)
    conversation = Conversation(tiny_model, "tiny", document, SETTINGS)
    try:
        list(conversation.open())
        with pytest.raises(PromptTooLongError, match="^the question is 10,021 tokens"):
            list(route.answer(conversation, LONG_QUESTION))
        done = list(route.answer(conversation, "What does box 3 hold?"))[-1]
        assert done.stats.prompt_tokens < 4096 and len(conversation.turns) == 1
        assert max(contexts_made) <= 4096
    finally:
        conversation.close()


def test_a_prompt_over_the_trained_context_is_refused_naming_its_parts(tiny_model, contexts_made) -> None:
    """A document read whole, earlier turns and a question each within bounds, together over the
    trained context: refused before the context grows (before, it grew past 4,096)."""
    document = Document(path=Path("boxes.txt"), kind="text", text="Box 3 holds code 1021. " * 150)
    conversation = Conversation(tiny_model, "tiny", document, SETTINGS)
    try:
        list(conversation.open())
        n_document = len(conversation.document_tokens)
        conversation.resume([Turn("why " * 100, "because " * 60)])
        with pytest.raises(PromptTooLongError) as raised:
            list(route.answer(conversation, "why " * 200))
        assert re.fullmatch(rf"the prompt is [\d,]+ tokens \({n_document:,} of the document, [\d,]+ of earlier turns, "
                            r"[\d,]+ of the question\); the model was trained on 4,096", raised.value.message)
        assert raised.value.hint == "ask a shorter question, or start a new conversation"
        assert max(contexts_made) <= 4096
    finally:
        conversation.close()


def test_a_streamed_document_answers_a_question_beside_its_kept_entries(tiny_model, contexts_made) -> None:
    """A document longer than the context is still read streamed; a question within its share
    is answered beside the kept entries, on a context no larger than the trained one."""
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(160))
    conversation = Conversation(tiny_model, "tiny", Document(path=Path("boxes.txt"), kind="text", text=text), SETTINGS)
    try:
        list(conversation.open())
        done = list(route.answer(conversation, "why " * 200 + "What is the code for box 3?"))[-1]
        assert done.stats.method == "snapstream" and done.stats.kept_tokens <= 96
        assert max(contexts_made) <= 4096
        with pytest.raises(PromptTooLongError, match="^the question is 10,021 tokens"):
            list(route.answer(conversation, LONG_QUESTION))
    finally:
        conversation.close()
