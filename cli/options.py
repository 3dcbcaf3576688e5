"""Options that `ask`, `chat`, `serve` and `bench` share, declared once: the user's settings made
into options from their fields (with_settings), which a command receives checked, as one
UserSettings (engine.ask_settings makes AskSettings of them); and --model."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable

import typer
from rich.console import Console

from kvchat.cli.config import source_of
from kvchat.engine import ADVANCED, ANSWER, NO_DRAFT, UserSettings, choices, panel, user_settings, value_type
from kvchat.errors import SettingsError
from kvchat.llama import gpu_offload_supported

MODEL = typer.Option("default", "--model", "-m", help="Registry name (see `kvchat models`) or a GGUF path.")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value: str | None) -> str | None:
    """A command-line argument as the text meant: each byte of it that was not UTF-8, which Python
    keeps as a lone surrogate (and no tokenizer takes), becomes U+FFFD, as a text editor shows it."""
    return None if value is None else LONE_SURROGATE.sub("\ufffd", value)


def check_draft(draft: str | None, read: str, hint: str = "leave --read at auto, or use --read fast") -> None:
    """A draft only serves a fast reading: refused with a full one, before a model loads."""
    if draft not in (None, NO_DRAFT) and read == "full":
        raise SettingsError("--draft does the cheap pass of a fast reading", hint)


# The CLI's own words for some settings: llama.cpp's short forms where the meaning is the same (-n,
# --temp, -t, -ngl, -c), and a name the option had before (a deprecated alias, still taken).
MORE_FLAGS = {"max_tokens": ("-n",), "system": ("-s",), "in_parts": ("--whole",), "temperature": ("--temp",),
              "threads": ("-t",), "gpu_layers": ("-ngl",), "n_ctx": ("--ctx-size", "-c")}
# The help panel of each kind of setting (UserSettings' `panel`); the others are listed with the command's options.
PANELS = {ANSWER: "Answer settings (also KVCHAT_<SETTING>, config.toml)", ADVANCED: "Advanced: how the kept entries are chosen"}


def setting_option(name: str) -> tuple[object, typer.models.OptionInfo]:
    """The option of the setting `name` (UserSettings), and the type the command receives from it:
    its flag is the name with dashes, its help the setting's description. Its value is checked
    with the others' (user_settings), so that a wrong one says what the server says."""
    field = UserSettings.model_fields[name]
    option_name, shown_in = flag(name), PANELS.get(panel(name))  # type: ignore[arg-type]
    if field.annotation is bool:
        return bool, typer.Option(field.default, f"{option_name}/--no-{option_name[2:]}", help=field.description, rich_help_panel=shown_in)
    kinds = choices(name)
    text = value_type(name) is str and not kinds  # free text, as a command line may hold it (as_text)
    kind = (str | None if field.default is None else str) if kinds else field.annotation  # a choice is checked with the others
    return kind, typer.Option(
        field.default, option_name, *MORE_FLAGS.get(name, ()), help=field.description, show_default=field.default is not None,
        callback=as_text if text else None, rich_help_panel=shown_in)


SOURCES = "settings_sources"  # the click context a command with settings is given, to name where a wrong value came from


def with_settings(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command taking the settings `names` as options, made from their fields (setting_option),
    and receiving them checked, together, as its `user` parameter (a UserSettings); a wrong value
    from the environment or the settings file is named so (config.source_of)."""
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command)
        signature = inspect.signature(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values() if p.name != "user"]
        options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=option)
                   for name in names for kind, option in [setting_option(name)]]
        context = inspect.Parameter(SOURCES, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        @functools.wraps(command)
        def with_user(**values: object) -> None:
            ctx = values.pop(SOURCES, None)
            user = user_settings({name: values.pop(name) for name in names}, called=lambda name: _called(ctx, name))
            command(**values, user=user)

        with_user.__signature__ = signature.replace(parameters=own + options + [context])  # type: ignore[attr-defined]
        with_user.__annotations__ = {p.name: p.annotation for p in own + options + [context]}
        return with_user
    return decorate


def every_setting_but(**not_taken: str) -> list[str]:
    """The settings' names but those a command does not take, each named with the reason why not:
    a command takes every setting (a new one too) unless it says why it cannot honour it."""
    if unknown := set(not_taken) - set(UserSettings.model_fields):
        raise ValueError(f"not settings: {', '.join(sorted(unknown))}")
    return [name for name in UserSettings.model_fields if name not in not_taken]


def _called(ctx: typer.Context | None, name: str) -> str | None:
    """Where the setting `name` came from, where not the command line (nor a test's direct call)."""
    setting = source_of(ctx, name) if ctx is not None else None
    return setting.called if setting is not None else None


def gpu_layers_warning(gpu_layers: int) -> str | None:
    """One line when --gpu-layers cannot take effect, which llama.cpp would not say."""
    if gpu_layers > 0 and not gpu_offload_supported():
        return (
            f"--gpu-layers {gpu_layers} has no effect: this llama-cpp-python build runs on the CPU only "
            "(reinstall it with CUDA or Metal: see docs/gpu.md)"
        )
    return None


def warn_about_gpu_layers(gpu_layers: int, console: Console) -> None:
    if warning := gpu_layers_warning(gpu_layers):
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def flag(setting: str) -> str:
    """How the CLI calls a setting: its option, and the name an error gives it (errors.py): `n_ctx` is --n-ctx."""
    return "--" + setting.replace("_", "-")
