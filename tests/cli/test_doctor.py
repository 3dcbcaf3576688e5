"""`kvchat doctor`: the report a user pastes into a bug report, and the smoke test in a child
process whose native crash becomes one line and exit 1 instead of the end of kvchat."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvchat.cli import app as cli_app
from kvchat.cli import doctor
from kvchat.engine.health import SMOKE_READ_TOKENS, smoke_test
from kvchat.llama import LLAMA_CPP_VERSION
from tests.cli.test_cli import run_kvchat

CRASHING_CHILD = (
    "import os, signal; print('stage: loading the model', flush=True); "
    "print('stage: reading a prompt', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
)


@pytest.mark.system
def test_the_report_has_versions_build_models_folders_memory_and_a_passing_smoke_test(tiny_model_path, isolated_home) -> None:
    result = run_kvchat("doctor", "--model", str(tiny_model_path), "--json", home=isolated_home)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["llama_cpp_python"] == LLAMA_CPP_VERSION == "0.3.36"
    assert report["llama_cpp"]["system_info"].startswith("CPU :")
    assert report["llama_cpp"]["weight_layout"] == "plain"
    assert [row["name"] for row in report["models"]] == ["default", "small"]
    assert not any(row["assembled"] or row["verified"] for row in report["models"])  # a new KVCHAT_HOME
    assert {name: Path(folder["path"]).parent for name, folder in report["folders"].items()} == {
        "data": isolated_home, "cache": isolated_home, "logs": isolated_home}
    assert 0 < report["memory"]["available_bytes"] <= report["memory"]["total_bytes"]
    smoke = report["smoke_test"]
    assert smoke["ok"] and smoke["model"] == str(tiny_model_path)
    assert smoke["read_tokens"] == SMOKE_READ_TOKENS and smoke["read_tok_s"] > 0 and smoke["decode_tok_s"] > 0
    assert set(smoke["weight_buffers_mib"]) == {"CPU_Mapped"}


@pytest.mark.system
def test_the_text_report_ends_with_the_smoke_test(tiny_model_path, isolated_home) -> None:
    result = run_kvchat("doctor", "--model", str(tiny_model_path), home=isolated_home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("kvchat 0.1.0 · Python ")
    assert lines[-1].startswith(f"smoke test: ok · read {SMOKE_READ_TOKENS} tokens at ")
    assert "weights in CPU_Mapped" in lines[-1]
    assert any(line.startswith("CPU weights: plain (KVCHAT_CPU_WEIGHTS: plain, extra)") for line in lines)


def _doctor(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(cli_app, "configure_logging", lambda: None)  # it would take kvchat's logs from caplog for good
    monkeypatch.setattr(sys, "argv", ["kvchat", "doctor", *args])
    with pytest.raises(SystemExit) as exit_:
        cli_app.main()
    return exit_.value.code, capsys.readouterr().out


@pytest.mark.system
def test_a_smoke_child_killed_by_sigsegv_is_one_line_naming_where_the_cause_and_the_workaround(
    tiny_model_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(doctor, "smoke_command", lambda *_: [sys.executable, "-c", CRASHING_CHILD])
    code, out = _doctor(monkeypatch, capsys, "--model", str(tiny_model_path))
    assert code == 1
    failed = [line for line in out.splitlines() if line.startswith("smoke test:")]
    assert failed == [
        "smoke test: FAILED · the smoke test crashed (SIGSEGV) while reading a prompt: likely a llama.cpp build "
        "made for another CPU, or a damaged one (hint: rebuild it on this machine: pip install --force-reinstall "
        "--no-cache-dir llama-cpp-python==0.3.36)"
    ]
    monkeypatch.setenv("KVCHAT_CPU_WEIGHTS", "extra")
    code, out = _doctor(monkeypatch, capsys, "--model", str(tiny_model_path), "--json")
    assert code == 1
    error = json.loads(out)["smoke_test"]["error"]
    assert error.startswith("the smoke test crashed (SIGSEGV) while reading a prompt: likely llama.cpp's ")
    assert error.endswith("(hint: unset KVCHAT_CPU_WEIGHTS (extra buffer types are experimental))")


@pytest.mark.system
def test_a_smoke_child_that_fails_quotes_its_last_line_and_a_missing_model_is_a_failed_smoke_test(
    tiny_model_path, tmp_path, monkeypatch, capsys
) -> None:
    failing = "import sys; print('stage: loading the model', flush=True); sys.exit('no luck')"
    monkeypatch.setattr(doctor, "smoke_command", lambda *_: [sys.executable, "-c", failing])
    code, out = _doctor(monkeypatch, capsys, "--model", str(tiny_model_path), "--json")
    assert code == 1 and json.loads(out)["smoke_test"] == {
        "ok": False, "error": "the smoke test failed while loading the model: no luck"}
    code, out = _doctor(monkeypatch, capsys, "--model", str(tmp_path / "gone.gguf"), "--json")
    smoke = json.loads(out)["smoke_test"]
    assert code == 1 and smoke == {"ok": False, "error": f"no model named or found at '{tmp_path / 'gone.gguf'}' "
                                   "(hint: use one of: default, small, a .gguf path, ollama:NAME[:TAG], lmstudio:PUBLISHER/MODEL "
                                   "or hf:ORG/REPO[:QUANT] (kvchat models lists them))"}


def test_the_smoke_test_names_each_step_before_it_starts(tiny_model_path) -> None:
    stages: list[str] = []
    result = smoke_test(tiny_model_path, stage=stages.append)
    assert stages == ["loading the model", "reading a prompt", "decoding"]
    assert result["read_tokens"] == SMOKE_READ_TOKENS and result["weight_layout"] == "plain"
