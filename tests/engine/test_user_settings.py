"""Each user setting is declared once (kvchat/engine/user_settings.py): its CLI option, its
`KVCHAT_<SETTING>` default, its server request field and its chat form field are made from it, and
a wrong value is refused with one message from every front end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
import typer

from textual.widgets import Input, Label, Select

from tests.fake_engine import FakeEngine
from tests.fake_sessions import FakeSessions
from tests.server_harness import serving
from tests.tui.test_tui import SIZE, wait_for
from kvchat.cli import app as cli_app
from kvchat.cli import config
from kvchat.engine import SELECTIONS, StreamSettings, UserSettings, ask_settings, choices, setting_names, user_settings
from kvchat.errors import SettingsError
from kvchat.server.schemas import ChatCompletionRequest
from kvchat.tui.app import KvchatApp
from kvchat.tui.screens import SettingsScreen

COMMAND = typer.main.get_command(cli_app.app)
FIELDS = UserSettings.model_fields
OTHER_VALUE = {
    "budget": "512", "window": "16", "kernel": "5", "pool": "avg", "heads": "max", "spans": "sentences", "method": "full",
    "chunk": "256", "recent": "32", "temperature": "0.5", "seed": "3", "threads": "1", "gpu_layers": "2", "flash_attn": "on",
    "cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_ctx": "4096", "n_batch": "256", "cache": "false", "draft": "small",
    "max_tokens": "7", "read": "retrieval", "in_parts": "off", "sources": "false", "system": "Be brief.", "select": "reuse",
}


def _options(command_name: str, setting: str) -> list[object]:
    return [param for param in COMMAND.commands[command_name].params if param.name == setting]  # type: ignore[attr-defined]


def test_every_setting_has_a_value_here_unlike_its_default() -> None:
    assert set(OTHER_VALUE) == set(FIELDS)
    assert all(str(FIELDS[name].default).lower() != value for name, value in OTHER_VALUE.items())


@pytest.mark.parametrize("name", list(FIELDS))
def test_a_setting_is_one_option_of_ask_named_and_described_by_its_field(name) -> None:
    [option] = _options("ask", name)
    flag = "--" + name.replace("_", "-")
    assert option.opts[0] == flag and option.help == FIELDS[name].description  # type: ignore[attr-defined]
    assert option.default == FIELDS[name].default  # type: ignore[attr-defined]
    grids = {("bench", "budget"), ("bench", "read")}  # the bench's own options: several values each, a run for each
    shared = [command for command in ("chat", "serve", "read", "inspect", "doctor", "bench")
              if _options(command, name) and (command, name) not in grids]
    assert all(len(_options(command, name)) == 1 and _options(command, name)[0].help == FIELDS[name].description
               for command in shared)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(FIELDS))
def test_a_setting_takes_its_default_from_one_environment_variable(name, monkeypatch) -> None:
    monkeypatch.delenv(config.CONFIG_ENV, raising=False)
    monkeypatch.setattr(config, "config_path", lambda: Path("/nonexistent/config.toml"))
    for variable in [variable for variable in os.environ if variable.startswith("KVCHAT_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv(f"KVCHAT_{name.upper()}", OTHER_VALUE[name])
    found = [setting for setting in config.settings(COMMAND) if setting.command == "ask"]
    assert [(setting.option, setting.parameter, setting.value, setting.source) for setting in found] == [
        (name, name, OTHER_VALUE[name], f"KVCHAT_{name.upper()}")]


def test_the_served_settings_are_the_requests_kv_fields_with_their_descriptions() -> None:
    served = setting_names(served=True)
    assert served == ["budget", "method", "read", "in_parts", "sources"]
    for name in served:
        field = ChatCompletionRequest.model_fields[f"kv_{name}"]
        assert field.default is None and field.description.startswith(f"{FIELDS[name].description} ")
    assert ChatCompletionRequest.model_fields["kv_read"].description.endswith(" Unset: the server's --read.")
    assert not [name for name in FIELDS if name not in served and f"kv_{name}" in ChatCompletionRequest.model_fields]
    assert setting_names(in_form=True) == ["budget", "window", "kernel", "pool", "method", "temperature", "max_tokens", "in_parts"]
    assert choices("in_parts") == ("auto", "on", "off") and choices("pool") == ("max", "avg") and choices("budget") == ()


def _cli_error(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    monkeypatch.setattr(cli_app, "configure_logging", lambda: None)
    monkeypatch.setattr(sys, "argv", ["kvchat", *args])
    with pytest.raises(SystemExit) as exited:
        cli_app.main()
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("name", "request_value", "said", "cli_hint", "server_hint"), [
    ("in_parts", "always", "unknown {} 'always'", "use auto, on or off", "use auto, on or off"),
    ("read", "skim", "unknown {} 'skim'", "use auto, full, fast or retrieval", "use auto, full, fast or retrieval"),
    ("budget", 8, "{} should be greater than or equal to 16, not 8", "1024 is the default", "use 16 to 1024, or leave it out for 1024"),
])
def test_a_wrong_value_says_the_same_from_the_cli_and_the_server(name, request_value, said, cli_hint, server_hint, monkeypatch,
                                                                  capsys, tmp_path) -> None:
    flag = "--" + name.replace("_", "-")
    code, stderr = _cli_error(["ask", str(tmp_path / "a.txt"), "Who?", flag, str(request_value)], monkeypatch, capsys)
    assert code == 2 and stderr == f"kvchat: error: {said.format(flag)} (hint: {cli_hint})\n"
    with serving(FakeEngine().service()) as url:
        refused = httpx.post(f"{url}/v1/chat/completions", json={
            "model": "kvchat-test", "messages": [{"role": "user", "content": "Who?"}], f"kv_{name}": request_value})
    assert refused.status_code == 400
    assert refused.json()["error"] == {"message": f"{said.format(f'kv_{name}')} (hint: {server_hint})", "type": "invalid_request_error",
                                       "param": f"kv_{name}", "code": "invalid_request"}


def test_the_old_name_of_in_parts_is_still_taken_by_the_server() -> None:
    assert ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], kv_whole="off").kv_in_parts == "off"


async def test_the_chat_form_has_a_field_for_each_form_setting_and_refuses_a_wrong_value_as_the_cli_does(
        monkeypatch, capsys, tmp_path) -> None:
    app = KvchatApp(FakeSessions(), [Path("notes.txt")])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        labels = [str(label.visual.plain) for label in app.screen.query("#settings-grid Label")]
        assert labels[-2:] == ["max tokens", "in parts"]
        assert app.screen.query_one("#in-parts", Select).value == "auto"
        app.screen.query_one("#max-tokens", Input).value = "0"
        error = app.screen.query_one("#settings-error", Label)
        await pilot.click("#save")
        await wait_for(pilot, lambda: error.visual.plain)
        shown = error.visual.plain
    code, stderr = _cli_error(["ask", str(tmp_path / "a.txt"), "Who?", "--max-tokens", "0"], monkeypatch, capsys)
    said = "{} should be greater than or equal to 1, not 0 (hint: 512 is the default)"
    assert (shown, code, stderr) == (said.format("max tokens"), 2, f"kvchat: error: {said.format('--max-tokens')}\n")


@pytest.mark.parametrize(("field", "value", "said"), [
    ("kv_budget", 2048, "kv_budget should be less than or equal to 1024 (this server's limit), not 2048 (hint: use 16 to 1024, or leave it out for 1024)"),
    ("kv_method", "snapstream", "unknown kv_method 'snapstream' (hint: use snapkv or full)"),
])
def test_the_server_bounds_a_setting_further_in_the_same_words(field, value, said) -> None:
    with serving(FakeEngine().service()) as url:
        refused = httpx.post(f"{url}/v1/chat/completions", json={
            "model": "kvchat-test", "messages": [{"role": "user", "content": "Who?"}], field: value})
    assert refused.status_code == 400 and refused.json()["error"]["message"] == said


def test_the_cli_settings_make_the_settings_of_an_ask() -> None:
    values = {name: value for name, value in OTHER_VALUE.items() if name not in ("kernel", "pool", "heads", "spans")}  # not full's
    settings = ask_settings(user_settings({**values, "read": "full"}))
    assert (settings.method.name, settings.method.budget, settings.method.window, settings.method_named) == ("full", 512, 16, True)
    assert (settings.sampler.temperature, settings.sampler.seed, settings.threads, settings.n_ctx, settings.n_batch) == (0.5, 3, 1, 4096, 256)
    assert (settings.layout.flash_attn, settings.layout.type_k, settings.layout.type_v) == (True, "q8_0", "q8_0")
    assert (settings.max_tokens, settings.read, settings.in_parts, settings.sources, settings.system) == (7, "full", "off", False, "Be brief.")
    assert (settings.stream, settings.select) == (StreamSettings(chunk=256, recent=32), "reuse")
    assert settings.held_settings()["chunk"] == 256 and tuple(SELECTIONS) == choices("select")


def test_chat_takes_every_setting_and_serve_every_one_but_those_it_says_why_not() -> None:
    assert [param.name for param in COMMAND.commands["chat"].params if param.name in FIELDS] == list(FIELDS)  # type: ignore[attr-defined]
    served = {param.name for param in COMMAND.commands["serve"].params} & set(FIELDS)  # type: ignore[attr-defined]
    assert set(FIELDS) - served == {"method", "select", "n_ctx"}


def test_an_unset_window_is_the_default_one_or_the_longest_a_small_budget_holds() -> None:
    assert [ask_settings(UserSettings(budget=budget)).method.window for budget in (16, 39, 40, 1024)] == [8, 31, 32, 32]
    assert ask_settings(UserSettings(budget=16, window=4)).method.window == 4
    with pytest.raises(SettingsError, match="budget 20 is smaller than window 32"):
        ask_settings(UserSettings(budget=20, window=32))
