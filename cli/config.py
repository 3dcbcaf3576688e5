"""Option defaults from the environment and a settings file: one source for every command's
options, flag > environment (`KVCHAT_<OPTION>`, e.g. KVCHAT_BUDGET=512) > file > kvchat's default.

The file is TOML, `<config dir>/config.toml` (KVCHAT_CONFIG names another): a key at the top
applies to every command that has the option, a table (`[serve]`, `[cache.list]`) to one command.
Keys are the options' flags with underscores (`max_tokens = 256`, `json = true`), and so are the
variables' names (KVCHAT_JSON for `--json`). main() hands the defaults to
click as its default_map; `kvchat config` shows each value and where it came from.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import typer

from kvchat.errors import SettingsError
from kvchat.paths import config_dir

CONFIG_ENV = "KVCHAT_CONFIG"
# options no default is kept for; bench's `--json PATH` would take KVCHAT_JSON, the other commands' switch
NOT_SETTINGS = {"help", "version", "install_completion", "show_completion", "job", "json_path"}


@dataclass(frozen=True)
class Setting:
    command: str  # "ask", "cache list"
    option: str  # "max_tokens", "json": the flag, underscored
    parameter: str  # the command's parameter it sets: "max_tokens", "as_json"
    value: object
    source: str  # "KVCHAT_MAX_TOKENS", "/home/me/.config/kvchat/config.toml [serve]"


def config_path() -> Path:
    return Path(os.environ[CONFIG_ENV]).expanduser() if os.environ.get(CONFIG_ENV) else config_dir() / "config.toml"


def _file(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as error:
        raise SettingsError(f"cannot read the settings file {path}: not UTF-8 text (byte {error.start})",
                            f"save it as UTF-8, or move it away (or set {CONFIG_ENV})") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SettingsError(f"cannot read the settings file {path}: {error}", f"fix it, or move it away (or set {CONFIG_ENV})") from None


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    found = [(path, command)] if path else []
    for name, subcommand in getattr(command, "commands", {}).items():
        found += _commands(subcommand, (*path, name))
    return found


def _table(file: dict[str, object], path: tuple[str, ...]) -> dict[str, object]:
    table: object = file
    for name in path:
        table = table.get(name, {}) if isinstance(table, dict) else {}
    return table if isinstance(table, dict) else {}


def settings(app: object) -> list[Setting]:
    """Every option default set by the environment or the file, for each command of `app` (a
    click group), the environment's first."""
    path = config_path()
    file = _file(path)
    found = []
    for command_path, command in _commands(app):
        table = _table(file, command_path)
        for param in getattr(command, "params", []):
            if param.param_type_name != "option" or param.name in NOT_SETTINGS or param.multiple:
                continue
            name, command_name = _setting_name(param), " ".join(command_path)
            env = f"KVCHAT_{name.upper()}"
            if env in os.environ and env != "KVCHAT_API_KEY":  # the key has its own envvar already
                found.append(Setting(command_name, name, param.name, os.environ[env], env))
            elif name in table and not isinstance(table[name], dict):
                found.append(Setting(command_name, name, param.name, table[name], f"{path} [{'.'.join(command_path)}]"))
            elif name in file and not isinstance(file[name], dict):
                found.append(Setting(command_name, name, param.name, file[name], str(path)))
    return found


def _setting_name(param: object) -> str:
    """What the user calls an option: its flag, underscored (`--json` is `json`, not `as_json`)."""
    flags = [flag for flag in getattr(param, "opts", []) if flag.startswith("--")]
    return flags[0][2:].replace("-", "_") if flags else param.name  # type: ignore[attr-defined]


def default_map(app: object) -> dict[str, object]:
    """click's default_map: the settings found, nested by command."""
    tree: dict[str, object] = {}
    for setting in settings(app):
        node = tree
        for name in setting.command.split():
            node = node.setdefault(name, {})  # type: ignore[assignment]
        node[setting.parameter] = str(setting.value).lower() if isinstance(setting.value, bool) else setting.value
    return tree


def config_command(ctx: typer.Context) -> None:
    """Show the option defaults set by the environment (KVCHAT_<OPTION>) or the settings file, and
    where each came from; a flag on the command line still wins."""
    app = ctx.find_root().command
    found = settings(app)
    typer.echo(f"settings file: {config_path()}{'' if config_path().exists() else ' (none)'}")
    for setting in found:
        typer.echo(f"{setting.command} --{setting.option.replace('_', '-')} = {setting.value!s}   ({setting.source})")
    if not found:
        typer.echo("no option defaults set: every option has kvchat's default")
