"""The benchmark: task generators, scoring, the JSON schema, and a small run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvchat.bench.report import SCHEMA, summarize
from kvchat.bench.runner import BenchConfig, run_bench
from kvchat.bench.tasks import (
    contract_cases,
    multi_turn_case,
    multikey_case,
    needle_case,
    score,
    variable_tracking_case,
)

RECORD_KEYS = {
    "task", "meta", "method", "variant", "budget", "accuracy", "answer", "golds", "prompt_tokens", "kept_tokens",
    "compression", "kv_bytes_full", "kv_bytes_kept", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s",
    "snapkv_overhead", "peak_cells", "peak_rss_mib",
}


@pytest.fixture(scope="module")
def count_tokens(tiny_model):
    return lambda text: len(tiny_model.tokenize(text))


@pytest.mark.parametrize("length", [1000, 3000])
def test_needle_length_and_single_answer(count_tokens, length: int) -> None:
    for depth in (0.1, 0.5, 0.9):
        case = needle_case(count_tokens, length, depth, seed=3)
        assert case.document.count(case.answers[0]) == 1
        assert 0.9 * length <= count_tokens(case.document) <= length
        offset = case.document.index(case.answers[0]) / len(case.document)
        assert abs(offset - depth) < 0.1


def test_multikey_and_vt_answers_appear_once(count_tokens) -> None:
    case = multikey_case(count_tokens, 3000, 8, seed=4)
    assert case.document.count(case.answers[0]) == 1
    assert case.document.count("special magic number") == 8
    vt = variable_tracking_case(count_tokens, 3000, seed=4)
    value = vt.question.split("value ")[1].split(",")[0]
    assert vt.document.count(value) == 1 and len(vt.answers) == 5
    assert all(vt.document.count(f"VAR {name} =") == 1 for name in vt.answers)


def test_seeds_reproduce(count_tokens) -> None:
    assert needle_case(count_tokens, 1000, 0.5, 7) == needle_case(count_tokens, 1000, 0.5, 7)
    assert needle_case(count_tokens, 1000, 0.5, 7).answers != needle_case(count_tokens, 1000, 0.5, 8).answers
    assert multi_turn_case(count_tokens, 2000, (0.1, 0.9), 2) == multi_turn_case(count_tokens, 2000, (0.1, 0.9), 2)


def test_contract_answers_are_in_the_contracts() -> None:
    cases = contract_cases()
    assert len(cases) == 6
    for case in cases:
        assert case.answers[0].lower() in case.document.lower(), case.meta


def test_scoring_is_case_insensitive_substring() -> None:
    assert score("The number is 7007071.", ("7007071",)) == 1.0
    assert score("the state of ISRAEL", ("Israel",)) == 1.0
    assert score("700.", ("7007071",)) == 0.0
    assert score("AAAAA and BBBBB", ("aaaaa", "bbbbb", "ccccc", "ddddd")) == 0.5


def test_records_and_summary_on_the_tiny_model(tiny_model_path) -> None:
    from kvchat.engine import Engine

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=8)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    assert {r["method"] for r in records} == {"full", "snapkv", "streamingllm", "snapstream"}
    for record in records:
        assert set(record) == RECORD_KEYS
        assert record["kept_tokens"] <= record["prompt_tokens"]
    kept = {r["method"]: r["kept_tokens"] for r in records}
    assert kept["snapkv"] == kept["snapstream"] == 128
    assert kept["streamingllm"] < kept["full"] == records[0]["prompt_tokens"]
    summary = {row["variant"]: row for row in summarize(records)}
    assert summary["full"]["decode_speedup"] == 1.0
    assert summary["snapkv@128"]["kv_saving"] > 3


def test_bench_command_writes_json_and_plots(tiny_model_path, tmp_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "bench", "--quick", "--model", str(tiny_model_path),
         "--lengths", "600", "--budget", "96", "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "plots")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["schema"] == SCHEMA
    methods = {row["method"] for row in document["summary"]}
    assert methods == {"full", "snapkv", "streamingllm", "snapstream"}
    assert all("accuracy" in row and row["decode_tokens_per_s"] > 0 for row in document["summary"])
    for name in ("needle_heatmap.png", "accuracy_vs_budget.png", "decode_speed_vs_length.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "snapkv@96" in result.stdout


@pytest.mark.real_model
def test_quick_sized_run_on_the_default_model(real_engine) -> None:
    config = BenchConfig(tasks=("needle",), lengths=(1200,), depths=(0.5,), budgets=(256,), decode_tokens=16)
    records = {r["method"]: r for _, _, r in run_bench(real_engine, config) if r is not None}
    assert records["full"]["accuracy"] == 1.0
    assert records["snapkv"]["accuracy"] == 1.0 and records["snapkv"]["kept_tokens"] == 256
    assert records["snapstream"]["kept_tokens"] <= 256


@pytest.mark.parametrize("extra", [["--budget", "10"], ["--variant", "pool=median"], ["--tasks", "poetry"]])
def test_bench_refuses_bad_settings_with_one_line(extra, tiny_model_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--quick", "--model", str(tiny_model_path),
                             *extra], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error:")
