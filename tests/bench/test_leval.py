"""L-Eval in the bench: its metrics on known strings (as L-Eval's auto_eval scores them), its
prompts and parts, and a quick run on the small model over data laid out as L-Eval's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.bench.leval import (
    EXAM_MAX_TOKENS, LEVAL_TASKS, LevalSelection, head_to_tokens, in_part, leval_cases, leval_documents,
)
from kvchat.bench.leval_metrics import (
    f1_score, judgement, leval_score, loyalty_score, mc_answer, mc_reference, mc_score, rouge_l,
)
from kvchat.bench.runner import QUICK


def test_multiple_choice_letters_are_read_as_leval_reads_them() -> None:
    assert mc_answer("B", several=False) == "B"
    assert mc_answer("Based on the text, the answer is (C)", several=False) == "B"  # L-Eval's first capital A-D
    assert mc_answer("the answer is d", several=False) == "A"  # no capital: its guess
    assert mc_answer("   ", several=False) == "None"
    assert mc_answer("ACD", several=True) == "ACD"
    assert mc_answer("DA because", several=True) == "AD"
    assert mc_answer("The correct options are A and C.", several=True) == "AC"
    assert mc_answer("A. Volume\nC. Variety", several=True) == "AC"
    assert mc_answer("A, C", several=True) == "A"  # "C" ends the text: not an option mark
    assert mc_answer("(B)", several=True) == "B"
    assert mc_reference("(B) Their subconscious knew it") == "B" and mc_reference("ABC") == "ABC"


def test_multiple_choice_scores_one_for_the_letters_and_a_quarter_for_some_of_several() -> None:
    assert mc_score("C", "C", several=False) == 1.0
    assert mc_score("Based on it, (C)", "C", several=False) == 0.0  # read as "B"
    assert mc_score("B", "(B) Their subconscious", several=False) == 1.0
    assert mc_score("AC", "ABC", several=True) == 0.25
    assert mc_score("ABCD", "ABC", several=True) == 0.0
    assert mc_score("D", "ABC", several=True) == 0.0


def test_loyalty_f1_and_rouge_l() -> None:
    assert judgement("True [fact: False]") == "true" and judgement("It is untrue.") == "true"  # L-Eval's substring rule
    assert judgement("No idea") == "<error>"
    assert loyalty_score("False, because the ship", "True [fact: False]") == 0.0
    assert loyalty_score("True.", "True [fact: False]") == 1.0
    assert f1_score("The cat sat", "a cat sat down") == pytest.approx(0.8)
    assert f1_score("Nothing alike", "cat") == 0.0
    assert rouge_l("the cat is on the mat", "the cat sat on the mat") == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="no L-Eval scoring 'leval-f2'"):
        leval_score("leval-f2", "a", "b")


def write_leval_data(folder: Path) -> Path:
    """Task files laid out as LEval-data: four documents per task (two dev, two held-out), and one
    document judged by an LLM, which L-Eval's automatic evaluation leaves out."""
    closed, opened = folder / "Closed-ended-tasks", folder / "Open-ended-tasks"
    closed.mkdir(parents=True)
    opened.mkdir(parents=True)

    def document(number: int, evaluation: str, questions: list[tuple[str, str]]) -> str:
        text = " ".join(f"Lecture {number} says that fact {i} is about topic {i * number}." for i in range(40))
        return json.dumps({"input": text, "instructions": [q for q, _ in questions], "outputs": [a for _, a in questions],
                           "source": "test", "evaluation": evaluation})

    mc = [(f"what does lecture say about fact {i}\nA. topic one\nB. topic two\nC. nothing\nD. all", "B") for i in range(4)]
    (closed / "tpo.jsonl").write_text("\n".join(document(n, "exam", mc) for n in range(4)) + "\n")
    qa = [(f"What is fact {i} about?", f"topic {i}") for i in range(3)]
    lines = [document(9, "LLM", qa)] + [document(n, "f1", qa) for n in range(4)]
    (opened / "legal_contract_qa.jsonl").write_text("\n".join(lines) + "\n")
    summary = [("Write a summary.", "The lectures list forty facts, each about a topic.")]
    (opened / "gov_report_summ.jsonl").write_text("\n".join(document(n, "rouge", summary) for n in range(4)) + "\n")
    return folder


def test_documents_parts_prompts_and_lengths(tmp_path: Path) -> None:
    folder = write_leval_data(tmp_path / "LEval-data")
    legal = leval_documents(folder, "leval-legal")
    assert len(legal) == 4 and legal[0].text.startswith("Lecture 0")  # the LLM-judged document is left out
    count = lambda text: len(text.split())  # noqa: E731 - a word a token
    dev = leval_cases(count, 10_000, ("leval-tpo", "leval-legal"), folder, LevalSelection(part="dev"))
    held_out = leval_cases(count, 10_000, ("leval-tpo",), folder, LevalSelection(part="held-out", documents=1, questions=2))
    assert [(c.task, c.meta["document"]) for c in dev] == [("leval-tpo", 0)] * 4 + [("leval-tpo", 1)] * 4 + [
        ("leval-legal", 0)] * 3 + [("leval-legal", 1)] * 3
    assert [(c.meta["document"], c.meta["question"]) for c in held_out] == [(2, 0), (2, 1)]
    after_the_first = leval_cases(count, 10_000, ("leval-tpo",), folder, LevalSelection(part="held-out", skip=1, questions=1))
    assert [(c.meta["document"], c.meta["question"]) for c in after_the_first] == [(3, 0)]
    skipped_then_taken = leval_cases(count, 10_000, ("leval-tpo",), folder, LevalSelection(skip=1, documents=2, questions=1))
    assert [c.meta["document"] for c in skipped_then_taken] == [1, 2]
    exam, open_ended = dev[0], dev[8]
    assert exam.question.endswith("D. all.  Please directly give the answer without any additional output or explanation")
    assert exam.system == LEVAL_TASKS["leval-tpo"].system and exam.max_tokens == EXAM_MAX_TOKENS
    assert open_ended.question == "What is fact 0 about? \nAnswer this question with 2 words."
    assert open_ended.max_tokens == 19 and open_ended.scoring == "leval-f1"
    cut = leval_cases(count, 150, ("leval-tpo",), folder, LevalSelection(documents=1, questions=1))[0]
    room = 150 - count(LEVAL_TASKS["leval-tpo"].system) - EXAM_MAX_TOKENS  # the system prompt and the answer have room
    assert cut.meta["cut"] and cut.document == head_to_tokens(legal[0].text, count, room) and count(cut.document) == room
    assert QUICK.leval == LevalSelection(part="dev", documents=1, questions=3, shortest_first=True)
    (shortest,) = {case.meta["document"] for case in leval_cases(count, 10_000, ("leval-tpo",), folder, QUICK.leval)}
    dev = in_part(leval_documents(folder, "leval-tpo"), "dev")
    assert len(dev[shortest].text) == min(len(document.text) for document in dev)
    (next_shortest,) = {case.meta["document"] for case in leval_cases(count, 10_000, ("leval-tpo",), folder, replace(QUICK.leval, skip=1))}
    assert next_shortest != shortest and len(dev[next_shortest].text) == max(len(document.text) for document in dev)


@pytest.mark.system
def test_quick_leval_run_on_the_small_model(small_model_path: Path, tmp_path: Path, isolated_home: Path) -> None:
    folder = write_leval_data(tmp_path / "LEval-data")
    out = tmp_path / "leval.json"
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "bench", "--tasks", "leval-tpo,leval-legal,leval-govreport", "--quick",
         "--leval-data", str(folder), "--methods", "full,snapkv", "--budget", "256", "--model", str(small_model_path),
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr
    records = json.loads(out.read_text())["records"]
    cases = sorted({(r["task"], r["meta"]["document"], r["meta"]["question"]) for r in records})
    assert cases == [("leval-govreport", 0, 0)] + [("leval-legal", 0, q) for q in range(3)] + [("leval-tpo", 0, q) for q in range(3)]
    assert {r["variant"] for r in records} == {"full", "snapkv@256"}
    for record in records:
        assert 0.0 <= record["accuracy"] <= 1.0
        if record["task"] == "leval-tpo":
            assert record["accuracy"] == mc_score(record["answer"], "B", several=False)
        elif record["task"] == "leval-legal":
            assert record["accuracy"] == pytest.approx(f1_score(record["answer"], record["golds"][0]))
    assert "leval-tpo" in result.stdout and "leval-govreport" in result.stdout


@pytest.mark.system
def test_leval_tasks_without_data_or_with_a_bad_part_are_refused_before_loading(tmp_path: Path, isolated_home: Path) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    missing = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--tasks", "leval-tpo", "--model", "nowhere.gguf"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 2 and "--leval-data" in missing.stderr and "OpenLMLab/LEval" in missing.stderr
    empty = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--tasks", "leval-quality", "--leval-data", str(tmp_path)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert empty.returncode == 2 and f"no L-Eval file quality.jsonl in {tmp_path}" in empty.stderr
    part = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--tasks", "leval-tpo", "--leval-part", "test"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert part.returncode == 2 and "use dev, held-out, all" in part.stderr
    too_many = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--tasks", "leval-tpo,leval-legal", "--leval-data",
                               str(write_leval_data(tmp_path / "LEval-data")), "--leval-part", "held-out", "--leval-skip", "2",
                               "--model", "nowhere.gguf"], capture_output=True, text=True, env=env, timeout=120)
    assert too_many.returncode == 2 and "--leval-skip 2 leaves leval-tpo no document of its held-out part (it has 2)" in too_many.stderr
