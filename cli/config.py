"""Option defaults from the environment and a settings file: one source for every command's
options, flag > environment (`KVCHAT_<OPTION>`, e.g. KVCHAT_BUDGET=512) > file > kvchat's default.

The file is TOML, `<config dir>/config.toml` (KVCHAT_CONFIG names another): a key at the top
applies to every command that has the option, a table (`[serve]`, `[cache.list]`) to one command.
Keys are the options' flags with underscores (`max_tokens = 256`, `json = true`), and so are the
variables' names (KVCHAT_JSON for `--json`). main() hands the defaults to
click as its default_map; `kvchat config` shows each value and where it came from.

A variable set empty (`KVCHAT_CACHE=`) is unset, as for every variable kvchat reads. A key's value
is of the option's type (`budget = 512`, `system = "Be brief."`): an array, a table, a date, a
switch's true for text are refused, naming the file and key, rather than turned into text. A wrong
value names where it came from: the flag, the variable, or the file and key (source_of).
"""

from __future__ import annotations

import datetime
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
    file: Path | None = None  # the settings file it was read from; None: the environment

    @property
    def called(self) -> str:
        """Where a wrong value came from, as an error says it: the variable, or the file's key."""
        return self.source if self.file is None else f"{self.option} in {self.source}"

    @property
    def fix(self) -> str:
        """The hint for a wrong value: where to set it right."""
        return f"set {self.source} right, or unset it" if self.file is None else f"set {self.option} right in {self.file}, or remove it"


# The TOML values an option of each type takes; any other type's (text, a choice, a path) take a string.
TOML_TYPES: dict[object, tuple[type, ...]] = {int: (int,), float: (int, float), bool: (bool,)}
TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: 'text in quotes ("…")'}


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
    click group), the environment's first; a key of the wrong type raises SettingsError."""
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
            if os.environ.get(env) and env != "KVCHAT_API_KEY":  # the key has its own envvar already
                found.append(Setting(command_name, name, param.name, os.environ[env], env))
            elif _is_value(table, name, command):
                found.append(_from_file(command_name, name, param, table[name], f"{path} [{'.'.join(command_path)}]", path))
            elif _is_value(file, name, app):
                found.append(_from_file(command_name, name, param, file[name], str(path), path))
    return found


def _is_value(table: dict[str, object], name: str, group: object) -> bool:
    """Whether `name` in `table` holds a value: present, and not the table of `group`'s command of
    that name (`[cache.list]` beside the --cache switch, `[read]` beside --read)."""
    return name in table and not (isinstance(table[name], dict) and name in getattr(group, "commands", {}))


def _from_file(command: str, name: str, param: object, value: object, source: str, path: Path) -> Setting:
    """The setting of the key `name`, or SettingsError naming the file and key where its value is
    not of the option's type: click would make text of an array, a date or true (a prompt of
    "[1, 2]"), and a number of 512.5."""
    kind = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    takes = TOML_TYPES.get(kind, (str,))
    setting = Setting(command, name, param.name, value, source, path)  # type: ignore[attr-defined]
    if not isinstance(value, takes) or (isinstance(value, bool) and bool not in takes):
        raise SettingsError(f"{setting.called} should be {TYPE_WORDS.get(kind, TYPE_WORDS[str])}, not {_as_written(value)}",
                            setting.fix)
    return setting


def _as_written(value: object) -> str:
    """A TOML value as a settings file writes it: true, 2024-01-01, [1, 2], {'a': 1}."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return repr(value)


def source_of(ctx: typer.Context, parameter: str) -> Setting | None:
    """The setting of the environment or the settings file that gave `parameter` of ctx's command
    its value; None where the command line or kvchat's default did."""
    if getattr(ctx.get_parameter_source(parameter), "name", None) != "DEFAULT_MAP":
        return None
    command = " ".join(ctx.command_path.split()[1:])
    return next((setting for setting in settings(ctx.find_root().command)
                 if setting.command == command and setting.parameter == parameter), None)


def with_source(error: Exception) -> tuple[str, str] | None:
    """A value click could not take (`KVCHAT_BUDGET=abc`) from the environment or the settings
    file: click's message and a hint naming where it came from; None for one of the command line."""
    ctx, param = getattr(error, "ctx", None), getattr(error, "param", None)
    setting = source_of(ctx, param.name) if ctx is not None and param is not None and param.name else None
    if setting is None:
        return None
    error.param_hint = setting.called  # type: ignore[attr-defined]
    return error.format_message(), setting.fix  # type: ignore[attr-defined]


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
