"""The research scripts under bench/ (experiments beside `kvchat bench`), each run once, small, on
the tiny model or on shipped data: a change to the engine that breaks one fails here, not at the
next experiment. What they may import is tests/test_layering.py's."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # each runs a script, some in a process of its own

REPO = Path(__file__).parents[2]
BENCH = REPO / "bench"


def _main(script: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """Run `script` as `python bench/<script> args…` would, in this process."""
    monkeypatch.setattr(sys, "argv", [str(BENCH / script), *args])
    runpy.run_path(str(BENCH / script), run_name="__main__")


def _records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_multi_turn_scores_every_strategy_on_each_turn(tiny_model_path, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(tmp_path))  # its own KVCHAT_HOME, inside the test's
    _main("multi_turn.py", monkeypatch, "--cases", "1", "--length", "300", "--budget", "96", "--model", str(tiny_model_path))
    records = _records(capsys.readouterr().out)
    assert [record["strategy"] for record in records] == ["question", "reuse", "document", "full"]
    assert all(len(record["scores"]) == 3 for record in records)  # three facts asked in turn


def test_policy_variants_answers_each_case_with_every_variant(tiny_model_path, monkeypatch, capsys) -> None:
    _main("policy_variants.py", monkeypatch, "--cases", "1", "--length", "300", "--budgets", "96", "--variants", "max+sentences",
          "--model", str(tiny_model_path))
    records = _records(capsys.readouterr().out)
    assert sorted((record["task"], record["variant"]) for record in records) == sorted(
        (task, variant) for task in ("multikey", "needle", "needle", "needle") for variant in ("full", "max+sentences"))


def test_stream_variants_streams_each_case_once_per_variant(tiny_model_path, monkeypatch, capsys) -> None:
    _main("stream_variants.py", monkeypatch, "--length", "1500", "--budget", "96", "--n-ctx", "1024", "--depths", "0.5",
          "--multikey", "0", "--model", str(tiny_model_path))
    records = _records(capsys.readouterr().out)
    assert [record["variant"] for record in records] == ["query-aware", "query-aware+carry0.5", "query-agnostic"]
    assert all(record["prompt"] > 1024 for record in records)  # longer than the context: streamed


def test_whole_questions_tells_the_users_phrasings_as_docs_say(monkeypatch, capsys) -> None:
    _main("whole_questions.py", monkeypatch)
    table = capsys.readouterr().out.splitlines()
    assert "| users | 12 / 16 | 0 / 16 |" in table  # docs/bench/design-history.md, "Which questions are answered in parts"


def test_cuad_lists_asks_for_each_category_of_two_clauses_or_more() -> None:
    lists_of = runpy.run_path(str(BENCH / "cuad_lists.py"))["lists_of"]
    contract = {"id": "cuad_tom_online_hosting", "categories": [
        {"category": "Audit Rights", "clauses": [{"text": "Either party may audit the books."},
                                                 {"text": "may audit"}, {"text": "Audits happen yearly."}]},
        {"category": "Parties", "clauses": [{"text": "TOM Online"}, {"text": "Hosting Co."}]},
        {"category": "Cap On Liability", "clauses": [{"text": "Liability is capped at fees paid."}]},
    ]}
    assert lists_of(contract) == [{
        "id": "tomonline.audit_rights", "contract": "cuad_tom_online_hosting", "category": "Audit Rights",
        "question": "List and quote every clause of this contract about audit rights.",
        "clauses": ["Either party may audit the books.", "Audits happen yearly."],  # the clause inside another counted once
    }]


def test_cpu_speed_measures_a_configuration_in_a_child_process(tiny_model_path) -> None:
    run = subprocess.run([sys.executable, "bench/cpu_speed.py", "--model", str(tiny_model_path), "--prompt", "64",
                          "--decode", "4", "--runs", "1", "--layouts", "plain", "--threads", "1/1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (record,) = _records(run.stdout)
    assert (record["layout"], record["read_threads"], record["decode_threads"]) == ("plain", 1, 1)
    assert all(speed > 0 for speed in record["read_tok_s"] + record["decode_tok_s"])


def test_serve_capacity_measures_throughput_for_1_4_and_8_clients(tiny_model_path, monkeypatch, capsys) -> None:
    _main("serve_capacity.py", monkeypatch, "--throughput", "--requests", "1", "--max-tokens", "4", "--model", str(tiny_model_path))
    records = _records(capsys.readouterr().out)
    assert [(record["clients"], record["requests"]) for record in records] == [(1, 1), (4, 4), (8, 8)]


def test_serve_fairness_asks_a_short_question_during_a_long_reading(tiny_model_path, monkeypatch, capsys) -> None:
    document = REPO / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"
    _main("serve_fairness.py", monkeypatch, str(document), "--readings", "2", "--give-up", "120", "--model", str(tiny_model_path))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("max-readings 2: ") and "a short question during the reading answered in " in line


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_page_screenshots_writes_the_light_and_the_dark_page(tiny_model_path, tmp_path, monkeypatch) -> None:
    pytest.importorskip("playwright")
    _main("page_screenshots.py", monkeypatch, "--model", str(tiny_model_path), "--out", str(tmp_path))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["page-dark.png", "page-light.png"]


def test_passage_bank_answers_each_question_three_ways(tiny_model_path, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("KVCHAT_HOME", str(tmp_path))
    _main("passage_bank.py", monkeypatch, "--contracts", "1", "--max-document-tokens", "3000", "--budget", "256", "--read", "retrieval", "--max-tokens", "4", "--model", str(tiny_model_path),
          "--draft", "none")
    records = _records(capsys.readouterr().out)
    answers = [record for record in records if "way" in record]
    asked = sorted({record["id"] for record in answers})
    assert asked and [record["way"] for record in answers] == ["fresh"] * len(asked) + ["bank"] * len(asked) + ["whole"] * len(asked)
    assert all(record["read"].endswith(" loaded") for record in answers if record["way"].startswith("bank"))
    (contract,) = [record for record in records if "bank_mib" in record]
    assert contract["bank_mib"] > 0 and records[-1]["bank"]["of"] == len(asked)


def test_passage_bank_answers_again_from_the_banks_a_home_saved(tiny_model_path, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("KVCHAT_HOME", str(tmp_path))
    runs = []
    for saved in ([], ["--saved"]):
        _main("passage_bank.py", monkeypatch, "--contracts", "1", "--max-document-tokens", "3000", "--budget", "256", "--read", "retrieval",
              "--max-tokens", "4", "--model", str(tiny_model_path), "--draft", "none", "--no-fresh", "--no-whole", *saved)
        runs.append(_records(capsys.readouterr().out))
    (read,), (loaded,) = ([record for record in records if "bank_mib" in record] for records in runs)
    assert read["bank_read_s"] is not None and loaded["bank_read_s"] is None and loaded["bank_mib"] == read["bank_mib"]
    assert [record["answer"] for record in runs[1] if "way" in record] == [record["answer"] for record in runs[0] if "way" in record]


def test_standing_plot_draws_the_records_it_is_given(monkeypatch, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    _main("standing_plot.py", monkeypatch, "--records", str(BENCH.parent / "docs" / "bench"), "--out", str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_choose_by_words_sets_each_questions_words_beside_both_readings_scores(tiny_model_path, monkeypatch, capsys,
                                                                              tmp_path) -> None:
    record = tmp_path / "record.jsonl"
    record.write_text("\n".join(json.dumps({"way": way, "id": "todos.law", "score": score}) for way, score in (("bank", 1.0), ("whole", 0.0))))
    _main("choose_by_words.py", monkeypatch, str(record), "--model", str(tiny_model_path), "--max-document-tokens", "100000")
    (row,) = _records(capsys.readouterr().out)
    assert (row["id"], row["bank"], row["whole"], row["differ"]) == ("todos.law", 1.0, 0.0, True) and row["top"] >= row["second"]
