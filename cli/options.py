"""Options that `ask`, `chat`, `serve` and `bench` share, declared once, with their defaults
taken from the settings objects they fill (AskSettings, its method, sampler and KV layout); and
`ask_settings()`, the one place they become AskSettings."""

from __future__ import annotations

import re

import typer
from rich.console import Console

from kvchat.engine import AskSettings, KvLayout, paired_draft
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
MAX_TOKENS = typer.Option(DEFAULTS.max_tokens, "--max-tokens", "-n", help="Most tokens per answer.")
TEMPERATURE = typer.Option(DEFAULTS.sampler.temperature, "--temperature", "--temp", help="0 = greedy (deterministic).")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value: str | None) -> str | None:
    """A command-line argument as the text meant: each byte of it that was not UTF-8, which Python
    keeps as a lone surrogate (and no tokenizer takes), becomes U+FFFD, as a text editor shows it."""
    return None if value is None else LONE_SURROGATE.sub("\ufffd", value)


SYSTEM = typer.Option(None, "--system", "-s", show_default=False, callback=as_text,
                      help="The system prompt (default: kvchat's: answer from the document only, quote exactly, keep it short).")
N_BATCH = typer.Option(DEFAULTS.n_batch, help="Tokens read per step: a reading's chunk, and the largest --window.")
THREADS = typer.Option(DEFAULTS.threads, "--threads", "-t",
                       help="CPU threads for reading and decoding (default: every CPU kvchat may use).")
GPU_LAYERS = typer.Option(0, "--gpu-layers", "-ngl", help="Layers to offload to the GPU (a CUDA or Metal build; see docs/gpu.md).")
FLASH_ATTN = typer.Option("auto", help="on, off, or auto (on with --gpu-layers); on: scores from queries and keys.")
CACHE_TYPE_K = typer.Option(DEFAULTS.layout.type_k, help="KV cache type of K: f16 or q8_0.")
CACHE_TYPE_V = typer.Option(DEFAULTS.layout.type_v, help="KV cache type of V: f16 or q8_0 (q8_0 needs flash attention).")
SOURCES = typer.Option(DEFAULTS.sources, "--sources/--no-sources", help="Name the passages each answer drew on (from its attention).")
READ = typer.Option(
    DEFAULTS.read, help="auto: fast for a new document's first question when the model has a draft installed (the "
    "default model: small) and the document is long enough, full otherwise; full: every layer reads the whole "
    "document; fast: a cheap pass (the first layers of --draft, or of the model itself with --draft none) chooses "
    "the tokens and the whole model reads only those for the first answer; retrieval: the passages the question's "
    "words choose (BM25, as retrieval tools do) are read alone for the first answer; follow-ups are selected from a "
    "whole reading (docs/how-it-works.md: Reading fast).",
)
WHOLE = typer.Option(
    DEFAULTS.whole, help="Questions about the whole document (a summary, every clause of a kind, a comparison) are "
    "answered from all of it, in parts, each asked in turn, the answer each part's. auto: the questions whose wording "
    "asks about the whole (\"Summarize this agreement\", \"List every …\"); on: every question; off: none, each "
    "answered from the entries its question keeps (docs/how-it-works.md: Questions about the whole document).",
)
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


def ask_settings(
    method: str | None,
    layout: KvLayout,
    max_tokens: int,
    temperature: float,
    threads: int | None,
    seed: int | None = None,
    n_ctx: int | None = None,
    sources: bool = DEFAULTS.sources,
    read: str = DEFAULTS.read,
    n_batch: int = DEFAULTS.n_batch,
    system: str | None = None,
    whole: str = DEFAULTS.whole,
    **method_options: object,
) -> AskSettings:
    """AskSettings from a command's options; `method_options` (budget, window, kernel …) go to
    the method, those left unset (None) aside: one the method has not is an error naming those
    it has. A method left unnamed (None) is the default one, which streams a document too long
    to read whole."""
    given = {name: value for name, value in method_options.items() if value is not None}
    return AskSettings(
        method=method_named(method or DEFAULTS.method.name, **given),
        auto_stream=method is None,
        max_tokens=max_tokens,
        sampler=SamplerSettings(temperature=temperature, seed=seed),
        n_ctx=n_ctx,
        n_batch=n_batch,
        system=system,
        threads=threads,
        layout=layout,
        sources=sources,
        read=read,
        whole=whole,
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
