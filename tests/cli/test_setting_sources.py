"""A setting's value from the command line, the environment or the settings file: bounded where
llama.cpp would crash on it or wrap it, typed as the option is, an empty variable unset, and a wrong
value named by where it came from (issue 67, rows 2 and 10). Usage errors, in this process through
the console script's entry point: each fails before a model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kvchat.cli import app as cli_app
from kvchat.cli import config, logs
from kvchat.errors import ModelError, SettingsError

COMMAND = typer.main.get_command(cli_app.app)
HUGE = ["2147483647", "4294967808", str(2**63)]  # a segfault, a wrap to 512 (2^32 + 512), a wrap to 0
MOST_TOKENS = 2**24  # the largest context a model may declare (kvchat/llama/shape_limits.py)
# The bound of each int setting a huge value crashed llama.cpp on or was wrapped to 32 bits for.
MOST = {"n_batch": MOST_TOKENS, "n_ctx": MOST_TOKENS, "budget": MOST_TOKENS, "max_tokens": MOST_TOKENS,
        "gpu_layers": 2**31 - 1, "seed": 2**32 - 2}


@pytest.fixture(autouse=True)
def no_kvchat_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets (KVCHAT_HOME aside: conftest's own folder for each test)."""
    for variable in [name for name in os.environ if name.startswith("KVCHAT_") and name != "KVCHAT_HOME"]:
        monkeypatch.delenv(variable)
    monkeypatch.setattr(cli_app, "configure_logging", lambda: None)


@pytest.fixture
def settings_file(isolated_home: Path) -> Path:
    path = isolated_home / "config" / "config.toml"  # the file kvchat reads without KVCHAT_CONFIG
    path.parent.mkdir(parents=True)
    return path


def kvchat(*args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """The exit code and stderr of `kvchat ARGS`, run in this process."""
    monkeypatch.setattr(sys, "argv", ["kvchat", *args])
    with pytest.raises(SystemExit) as exited:
        cli_app.main()
    return exited.value.code, capsys.readouterr().err


def ask(tmp_path: Path, *extra: str) -> list[str]:
    """`ask` with a model that is not there: were a value taken, loading it would fail instead."""
    return ["ask", str(tmp_path / "notes.txt"), "Who?", "--model", str(tmp_path / "absent.gguf"), *extra]


# ---- row 2: huge numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [(name, value) for name in MOST for value in HUGE if int(value) > MOST[name]])
def test_a_huge_number_is_refused_in_one_line_naming_the_limit(name, value, tmp_path, monkeypatch, capsys) -> None:
    flag = "--" + name.replace("_", "-")
    code, stderr = kvchat(*ask(tmp_path, flag, value), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and stderr.startswith(f"kvchat: error: {flag} should be less than or equal to {MOST[name]}, not {value} (hint: ")
    assert stderr.count("\n") == 1


def test_a_negative_seed_is_refused_it_wrapped_to_a_random_one(tmp_path, monkeypatch, capsys) -> None:
    code, stderr = kvchat(*ask(tmp_path, "--seed", "-1"), monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (2, "kvchat: error: --seed should be greater than or equal to 0, not -1 (hint: leave it unset)\n")


def test_a_huge_batch_from_the_variable_or_the_file_is_refused_naming_it(tmp_path, settings_file, monkeypatch, capsys) -> None:
    said = "should be less than or equal to 16777216, not 2147483647 (hint: 512 is the default)"
    monkeypatch.setenv("KVCHAT_N_BATCH", "2147483647")
    assert kvchat(*ask(tmp_path), monkeypatch=monkeypatch, capsys=capsys) == (2, f"kvchat: error: KVCHAT_N_BATCH {said}\n")
    monkeypatch.delenv("KVCHAT_N_BATCH")
    settings_file.write_text("n_batch = 2147483647\n")
    assert kvchat(*ask(tmp_path), monkeypatch=monkeypatch, capsys=capsys) == (2, f"kvchat: error: n_batch in {settings_file} {said}\n")


@pytest.mark.system
def test_a_huge_batch_on_the_tiny_model_is_one_line_not_a_segfault(tmp_path, tiny_model_path, isolated_home) -> None:
    """2147483647 ended in SIGSEGV in llama_batch_init; 4294967808 was read as 512 (a NULL pointer here)."""
    document = tmp_path / "notes.txt"
    document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(120)))
    for value in HUGE[:2]:
        result = subprocess.run(
            [sys.executable, "-m", "kvchat.cli", "ask", str(document), "How much is item 7?", "--model", str(tiny_model_path),
             "--threads", "2", "--n-batch", value], capture_output=True, text=True, timeout=120,
            env={**os.environ, "KVCHAT_HOME": str(isolated_home)})
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == f"kvchat: error: --n-batch should be less than or equal to 16777216, not {value} (hint: 512 is the default)\n"


@pytest.mark.parametrize(("extra", "said"), [
    (["--max-sessions", "100000"],
     "--max-sessions 100,000 is more than the 256 sequences llama.cpp holds in one context (hint: lower --max-sessions to 256 or less)"),
    (["--room", "4294967808"],  # 8 sequences of 2^32 + 2,560 cells wrapped to a context of 20,480
     "8 sequences of 4,294,969,344 cells are 34,359,754,752 cells, more than the largest context's 16,777,216 "
     "(hint: lower --max-sessions, or each sequence's cells (--budget, --room, --max-tokens))"),
])
def test_serve_refuses_a_shared_context_llama_cpp_cannot_make_naming_what_to_lower(extra, said, tmp_path, monkeypatch,
                                                                                 capsys) -> None:
    code, stderr = kvchat("serve", "--model", str(tmp_path / "absent.gguf"), *extra, monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (2, f"kvchat: error: {said}\n")


def test_serve_says_what_to_lower_when_llama_cpp_cannot_make_its_shared_context(tiny_model_path, monkeypatch, capsys) -> None:
    """The context's own hint named --n-ctx, which serve has not: its size is the sessions' cells."""
    import kvchat.server.service as service

    def too_big(*_args: object, **_kwargs: object) -> None:
        raise ModelError("llama.cpp could not create a context of 20480 tokens",
                         "lower `n_ctx` or `max_tokens`, free memory, or use f16 cache types (the log file has llama.cpp's reason)")

    monkeypatch.setattr(service, "ChatService", too_big)
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    code, stderr = kvchat("serve", "--model", str(tiny_model_path), "--port", port, "--threads", "2", "--no-cache",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (1, "kvchat: error: llama.cpp could not create a context of 20480 tokens (hint: lower --max-sessions, "
                                 "or each sequence's cells (--budget, --room, --max-tokens), free memory, or use f16 cache types "
                                 "(the log file has llama.cpp's reason))\n")


# ---- row 10: where a value came from -------------------------------------------------------------


@pytest.mark.parametrize("name", ["CACHE", "BUDGET", "SYSTEM", "READ", "JSON"])
def test_an_empty_variable_is_unset_and_the_file_applies(name, settings_file, monkeypatch) -> None:
    """KVCHAT_CACHE= turned the cache off, while KVCHAT_BUDGET= was an error."""
    settings_file.write_text("budget = 64\n")
    monkeypatch.setenv(f"KVCHAT_{name}", "")
    found = {(setting.command, setting.option): setting for setting in config.settings(COMMAND)}
    assert not [setting for setting in found.values() if setting.source.startswith("KVCHAT_")]
    assert (found["ask", "budget"].value, found["ask", "budget"].source) == (64, str(settings_file))


def test_an_empty_log_level_is_unset_and_an_unknown_one_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("KVCHAT_LOG_LEVEL", "")
    assert logs._level() == "INFO"  # a ValueError traceback before
    monkeypatch.setenv("KVCHAT_LOG_LEVEL", "debug")
    assert logs._level() == "DEBUG"
    monkeypatch.setenv("KVCHAT_LOG_LEVEL", "loud")
    with pytest.raises(SettingsError, match="unknown KVCHAT_LOG_LEVEL 'loud'"):
        logs._level()


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("KVCHAT_BUDGET", "abc", "Invalid value for KVCHAT_BUDGET: Input should be a valid integer, unable to parse string as an "
                             "integer (hint: set KVCHAT_BUDGET right, or unset it)"),
    ("KVCHAT_BUDGET", "8", "KVCHAT_BUDGET should be greater than or equal to 16, not 8 (hint: 1024 is the default)"),
    ("KVCHAT_READ", "skim", "unknown KVCHAT_READ 'skim' (hint: use auto, full, fast or retrieval)"),
    ("KVCHAT_CACHE", "maybe", "Invalid value for KVCHAT_CACHE: Input should be a valid boolean, unable to interpret input "
                              "(hint: set KVCHAT_CACHE right, or unset it)"),
    ("KVCHAT_MAX_SESSIONS", "x", "Invalid value for KVCHAT_MAX_SESSIONS: Input should be a valid integer, unable to parse string "
                                 "as an integer (hint: set KVCHAT_MAX_SESSIONS right, or unset it)"),
])
def test_a_wrong_value_from_a_variable_names_the_variable(variable, value, said, tmp_path, monkeypatch, capsys) -> None:
    """KVCHAT_BUDGET=abc said "Invalid value for '--budget'", naming neither the variable nor the file."""
    monkeypatch.setenv(variable, value)
    args = ["serve", "--model", str(tmp_path / "absent.gguf")] if variable == "KVCHAT_MAX_SESSIONS" else ask(tmp_path)
    assert kvchat(*args, monkeypatch=monkeypatch, capsys=capsys) == (2, f"kvchat: error: {said}\n")


def test_a_wrong_value_from_the_settings_file_names_the_file_and_the_key(tmp_path, settings_file, monkeypatch, capsys) -> None:
    settings_file.write_text("[ask]\nbudget = 8\n")
    code, stderr = kvchat(*ask(tmp_path), monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (2, f"kvchat: error: budget in {settings_file} [ask] should be greater than or equal to 16, not 8 "
                                 "(hint: 1024 is the default)\n")
    settings_file.write_text('budget = "abc"\n')
    code, stderr = kvchat(*ask(tmp_path), monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (2, f"kvchat: error: budget in {settings_file} should be a whole number, not 'abc' "
                                 f"(hint: set budget right in {settings_file}, or remove it)\n")


def test_a_wrong_value_on_the_command_line_names_the_flag_even_with_the_others_set(tmp_path, settings_file, monkeypatch,
                                                                                   capsys) -> None:
    settings_file.write_text("budget = 64\n")
    monkeypatch.setenv("KVCHAT_BUDGET", "96")
    code, stderr = kvchat(*ask(tmp_path, "--budget", "8"), monkeypatch=monkeypatch, capsys=capsys)
    assert (code, stderr) == (2, "kvchat: error: --budget should be greater than or equal to 16, not 8 (hint: 1024 is the default)\n")


@pytest.mark.parametrize(("written", "said"), [
    ("system = [1, 2]", 'system in {} should be text in quotes ("…"), not [1, 2]'),
    ("system = true", 'system in {} should be text in quotes ("…"), not true'),
    ("system = 2024-01-01", 'system in {} should be text in quotes ("…"), not 2024-01-01'),
    ("budget = {a = 1}", "budget in {} should be a whole number, not {{'a': 1}}"),
    ("budget = 512.5", "budget in {} should be a whole number, not 512.5"),
    ("budget = true", "budget in {} should be a whole number, not true"),
    ("cache = 1", "cache in {} should be true or false, not 1"),
    ("[serve]\nmax_sessions = [4]", "max_sessions in {} [serve] should be a whole number, not [4]"),
])
def test_a_key_of_another_type_than_its_option_is_refused_naming_the_file_and_key(written, said, settings_file, tmp_path,
                                                                                   monkeypatch, capsys) -> None:
    """An array, true or a date became the system prompt's text; a table for a number was ignored."""
    settings_file.write_text(written + "\n")
    key = said.split()[0]
    expected = f"kvchat: error: {said.format(settings_file)} (hint: set {key} right in {settings_file}, or remove it)\n"
    assert kvchat(*ask(tmp_path), monkeypatch=monkeypatch, capsys=capsys) == (2, expected)
    assert kvchat("config", monkeypatch=monkeypatch, capsys=capsys) == (2, expected)


def test_the_tables_of_commands_and_values_of_every_type_are_still_taken(settings_file) -> None:
    settings_file.write_text('read = "fast"\ntemperature = 1\nsources = false\nsystem = "Be brief."\n\n'
                             '[cache.list]\njson = true\n\n[serve]\nmax_sessions = 4\n')
    found = {(setting.command, setting.option): setting.value for setting in config.settings(COMMAND)}
    assert found["ask", "read"] == "fast" and found["ask", "temperature"] == 1 and found["ask", "sources"] is False
    assert found["ask", "system"] == "Be brief." and found["cache list", "json"] is True and found["serve", "max_sessions"] == 4
    assert ("ask", "cache") not in found  # the `cache` table is the cache command's, not the --cache switch
