"""What only a real model shows: the needle is still found after pruning. Default model, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.bench.tasks import needle_case, score
from kvchat.engine import AskSettings
from kvchat.bench.compare import answer_of, compare
from kvchat.events import Pruned
from kvchat.policy import SnapKV

pytestmark = pytest.mark.real_model
SAMPLE_PDF = Path(__file__).parents[1] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_needle_found_at_budget_256_and_full_agrees(real_engine, depth: float) -> None:
    model = real_engine.model
    case = needle_case(lambda text: len(model.tokenize(text)), 3000, depth, seed=int(depth * 100))
    snapkv = AskSettings(policy=SnapKV(budget=256), max_tokens=24)
    events, full_events = compare(real_engine, case, [snapkv, replace(snapkv, method="full")])
    pruned, full = answer_of(events), answer_of(full_events)
    assert 2800 <= pruned.stats.prompt_tokens <= 3300
    assert [e.kept_tokens for e in events if isinstance(e, Pruned)] == [256]
    assert score(pruned.answer, case.answers) == 1.0, (pruned.answer, case.answers)
    assert score(full.answer, case.answers) == 1.0, (full.answer, case.answers)


def test_quick_start_question_on_the_sample_contract(default_model_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    question = "Which country's law governs this agreement?"
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "ask", str(SAMPLE_PDF), question,
         "--model", str(default_model_path), "--json", "--max-tokens", "32"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert "israel" in record["answer"].lower()
    assert record["prompt_tokens"] > 6000 and record["kept_tokens"] == 1024
