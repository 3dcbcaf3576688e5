"""What only a real model shows: the needle is still found after pruning. Default model, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.bench.tasks import multi_turn_case, needle_case, score
from kvchat.documents import Document
from kvchat.engine import AskSettings
from kvchat.bench.compare import answer_of, compare
from kvchat.events import Evicted, Pruned
from kvchat.policy import Full, SnapKV, SnapStream

pytestmark = pytest.mark.real_model
SAMPLE_PDF = Path(__file__).parents[2] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_needle_found_at_budget_256_and_full_agrees(real_engine, depth: float) -> None:
    model = real_engine.model
    case = needle_case(lambda text: len(model.tokenize(text)), 3000, depth, seed=int(depth * 100))
    snapkv = AskSettings(method=SnapKV(budget=256), max_tokens=24)
    (_, _, events), (_, _, full_events) = compare(real_engine, [case], [snapkv, replace(snapkv, method=Full(budget=256))])
    pruned, full = answer_of(events), answer_of(full_events)
    assert 2800 <= pruned.stats.prompt_tokens <= 3300
    assert [e.kept_tokens for e in events if isinstance(e, Pruned)] == [256]
    assert score(pruned.answer, case.answers) == 1.0, (pruned.answer, case.answers)
    assert score(full.answer, case.answers) == 1.0, (full.answer, case.answers)


@pytest.mark.parametrize("method", [SnapKV(budget=256), Full()])
def test_the_needles_sentence_is_the_first_source_of_its_answer(real_engine, method) -> None:
    model = real_engine.model
    case = needle_case(lambda text: len(model.tokenize(text)), 3000, 0.5, seed=7)
    settings = AskSettings(method=method, max_tokens=24)
    ((_, _, events),) = compare(real_engine, [case], [settings])
    done = answer_of(events)
    assert score(done.answer, case.answers) == 1.0, (done.answer, case.answers)
    first = done.sources[0].text
    assert first.startswith("One of the special magic numbers for") and case.answers[0] in first, [s.text for s in done.sources]


def test_quick_start_question_on_the_sample_contract(small_model_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    question = "Which country's law governs this agreement?"
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "ask", str(SAMPLE_PDF), question,
         "--model", str(small_model_path), "--json", "--max-tokens", "32"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert "israel" in record["answer"].lower()
    assert record["prompt_tokens"] > 6000 and record["kept_tokens"] == 1024


def test_follow_up_questions_about_far_apart_facts_at_budget_256(real_engine) -> None:
    count_tokens = lambda text: len(real_engine.model.tokenize(text))  # noqa: E731
    case = multi_turn_case(count_tokens, 3500, (0.1, 0.9), seed=11)
    document = Document(path=Path("facts.txt"), kind="text", text=case.document)
    settings = AskSettings(method=SnapKV(budget=256), max_tokens=24)
    conversation = real_engine.conversation(document, settings)
    try:
        list(conversation.open())
        for question, answers in zip(case.questions, case.answers):
            done = list(real_engine.answer(conversation, question))[-1]
            assert score(done.answer, answers) == 1.0, (question, done.answer, answers)
    finally:
        conversation.close()


def test_second_ask_loads_the_saved_reading(small_model_path, isolated_home, tmp_path) -> None:
    case = needle_case(lambda text: len(text) // 4, 2000, 0.5, seed=5)
    document = tmp_path / "needle.txt"
    document.write_text(case.document)
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    command = [sys.executable, "-m", "kvchat.cli", "ask", str(document), case.question,
               "--model", str(small_model_path), "--json", "--max-tokens", "24"]
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "loaded the saved reading" not in first.stderr
    assert "loaded the saved reading" in second.stderr
    answers = [json.loads(result.stdout)["answer"] for result in (first, second)]
    assert answers[0] == answers[1] and score(answers[1], case.answers) == 1.0


def test_snapstream_finds_a_needle_in_a_document_three_times_the_context(real_engine) -> None:
    count_tokens = lambda text: len(real_engine.model.tokenize(text))  # noqa: E731
    case = needle_case(count_tokens, 6400, 0.4, seed=21)
    document = Document(path=Path("needle.txt"), kind="text", text=case.document)
    settings = AskSettings(method=SnapStream(budget=1024), max_tokens=24, n_ctx=2048)
    conversation = real_engine.conversation(document, settings)
    try:
        events = list(conversation.open(question=case.question))
        assert len(conversation.document_tokens) > 3 * 2048
        assert conversation.run.n_ctx == 2048 and conversation.run.cache.peak_cells <= 2048
        assert sum(isinstance(e, Evicted) for e in events) >= 5
        done = list(real_engine.answer(conversation, case.question))[-1]
        assert score(done.answer, case.answers) == 1.0, (done.answer, case.answers)
    finally:
        conversation.close()
