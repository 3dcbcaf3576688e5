"""Options that `ask`, `chat`, `serve` and `bench` share, declared once: the user's settings made
into options from their fields (with_settings), the others with their defaults taken from the
settings objects they fill (AskSettings, its method, sampler and KV layout); and `ask_settings()`,
the one place they become AskSettings."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable

import typer
from rich.console import Console

from kvchat.engine import AskSettings, KvLayout, UserSettings, choices, paired_draft, user_settings
from kvchat.errors import SettingsError
from kvchat.llama import SamplerSettings, gpu_offload_supported
from kvchat.policy import method_named, methods_help

DEFAULTS = AskSettings()

MODEL = typer.Option("default", "--model", "-m", help="Registry name (see `kvchat models`) or a GGUF path.")
ADVANCED = "Advanced: how the kept entries are chosen"  # the help panel of the selection-tuning options
METHOD = typer.Option(
    None, show_default=False, rich_help_panel=ADVANCED,
    help=f"{methods_help()}. Default: {DEFAULTS.method.name}, or snapstream for a document longer than the model's context.",
)
BUDGET = typer.Option(DEFAULTS.method.budget, help="KV entries kept for the prompt, observation window included.")
WINDOW = typer.Option(DEFAULTS.method.window, rich_help_panel=ADVANCED,
                      help="Observation window: the question's last tokens whose attention votes.")
# llama.cpp's short forms where the meaning is the same (-n, --temp, -t, -ngl, -c)
TEMPERATURE = typer.Option(DEFAULTS.sampler.temperature, "--temperature", "--temp", help="0 = greedy (deterministic).")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value: str | None) -> str | None:
    """A command-line argument as the text meant: each byte of it that was not UTF-8, which Python
    keeps as a lone surrogate (and no tokenizer takes), becomes U+FFFD, as a text editor shows it."""
    return None if value is None else LONE_SURROGATE.sub("\ufffd", value)


N_BATCH = typer.Option(DEFAULTS.n_batch, help="Tokens read per step: a reading's chunk, and the largest --window.")
THREADS = typer.Option(DEFAULTS.threads, "--threads", "-t",
                       help="CPU threads for reading and decoding (default: every CPU kvchat may use).")
GPU_LAYERS = typer.Option(0, "--gpu-layers", "-ngl", help="Layers to offload to the GPU (a CUDA or Metal build; see docs/gpu.md).")
FLASH_ATTN = typer.Option("auto", help="on, off, or auto (on with --gpu-layers); on: scores from queries and keys.")
CACHE_TYPE_K = typer.Option(DEFAULTS.layout.type_k, help="KV cache type of K: f16 or q8_0.")
CACHE_TYPE_V = typer.Option(DEFAULTS.layout.type_v, help="KV cache type of V: f16 or q8_0 (q8_0 needs flash attention).")
HEADS = typer.Option(
    None, show_default=False, rich_help_panel=ADVANCED,
    help="snapkv, snapstream: how the heads choose: sum (one ranking of their votes, the default), normalized, "
    "topk-count, max, or per-head (each layer and KV head keeps its own tokens, in the same number of cells).",
)
DRAFT = typer.Option(
    None, "--draft", show_default=False,
    help="A smaller model with the same vocabulary (registry name or GGUF path) that does the cheap pass of a "
    "fast reading: its attention chooses the tokens the model reads (Speculative Prefill). Default: the one the "
    "registry pairs with the model, if installed (small, for the default model); none: the model's own layers.",
)
NO_DRAFT = "none"  # --draft none: a fast reading's cheap pass is the model's own first layers
SAVE_READINGS = typer.Option(True, "--cache/--no-cache", help="Save each document's reading and reuse it next time.")


def check_draft(draft: str | None, read: str, hint: str = "leave --read at auto, or use --read fast") -> None:
    """A draft only serves a fast reading: refused with a full one, before a model loads."""
    if draft not in (None, NO_DRAFT) and read == "full":
        raise SettingsError("--draft does the cheap pass of a fast reading", hint)


def draft_for(model: str, draft: str | None, read: str) -> str | None:
    """The draft a command loads for fast readings: the one named, none for `--draft none`, else
    unless the reading is full the registry's pair for `model` (small, for the default model) if
    installed."""
    if draft == NO_DRAFT:
        return None
    if draft is not None:
        return draft
    return paired_draft(model) if read != "full" else None


# The CLI's own words for some settings: llama.cpp's short forms where the meaning is the same, and
# a name the option had before (a deprecated alias, still taken).
SETTINGS_PANEL = "Answer settings (also KVCHAT_<SETTING>, config.toml)"  # where the help lists them
MORE_FLAGS = {"max_tokens": ("-n",), "system": ("-s",), "in_parts": ("--whole",)}


def setting_option(name: str) -> tuple[object, typer.models.OptionInfo]:
    """The option of the setting `name` (UserSettings), and the type the command receives from it:
    its flag is the name with dashes, its help the setting's description. Its value is checked
    with the others' (user_settings), so that a wrong one says what the server says."""
    field = UserSettings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    if field.annotation is bool:
        return bool, typer.Option(field.default, f"{flag}/--no-{flag[2:]}", help=field.description, rich_help_panel=SETTINGS_PANEL)
    kinds = choices(name)
    text = field.annotation in (str, str | None) and not kinds  # free text, as a command line may hold it (as_text)
    return field.annotation if not kinds else str, typer.Option(
        field.default, flag, *MORE_FLAGS.get(name, ()), help=field.description, show_default=field.default is not None,
        callback=as_text if text else None, rich_help_panel=SETTINGS_PANEL)


def with_settings(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command taking the settings `names` as options, made from their fields (setting_option),
    and receiving them checked, together, as its `user` parameter (a UserSettings)."""
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command)
        signature = inspect.signature(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values() if p.name != "user"]
        options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=option)
                   for name in names for kind, option in [setting_option(name)]]

        @functools.wraps(command)
        def with_user(**values: object) -> None:
            user = user_settings({name: values.pop(name) for name in names})
            command(**values, user=user)

        with_user.__signature__ = signature.replace(parameters=own + options)  # type: ignore[attr-defined]
        with_user.__annotations__ = {p.name: p.annotation for p in own + options}
        return with_user
    return decorate


def ask_settings(
    user: UserSettings,
    method: str | None,
    layout: KvLayout,
    temperature: float,
    threads: int | None,
    seed: int | None = None,
    n_ctx: int | None = None,
    n_batch: int = DEFAULTS.n_batch,
    **method_options: object,
) -> AskSettings:
    """AskSettings from the user's settings and a command's other options; `method_options`
    (budget, window, kernel …) go to the method, those left unset (None) aside: one the method
    has not is an error naming those it has. A method left unnamed (None) is the default one,
    which streams a document too long to read whole."""
    given = {name: value for name, value in method_options.items() if value is not None}
    return AskSettings(
        **user.model_dump(),
        method=method_named(method or DEFAULTS.method.name, **given),
        auto_stream=method is None,
        sampler=SamplerSettings(temperature=temperature, seed=seed),
        n_ctx=n_ctx,
        n_batch=n_batch,
        threads=threads,
        layout=layout,
    )


def flash_attention(choice: str, gpu_layers: int) -> bool:
    """--flash-attn on|off|auto; auto is on when layers run on a GPU (where the fused kernel
    saves memory and time) and off on the CPU (where reading the softmax is exact and cheaper)."""
    if choice not in ("on", "off", "auto"):
        raise SettingsError(f"unknown --flash-attn {choice!r}", "use on, off or auto")
    return choice == "on" or (choice == "auto" and gpu_layers > 0 and gpu_offload_supported())


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


def kv_layout(flash_attn: str, gpu_layers: int, cache_type_k: str, cache_type_v: str) -> KvLayout:
    return KvLayout(flash_attention(flash_attn, gpu_layers), cache_type_k, cache_type_v)


def flag(setting: str) -> str:
    """How the CLI calls a setting an error names (errors.py): its option, `n_ctx` is --n-ctx."""
    return "--" + setting.replace("_", "-")
