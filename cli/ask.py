"""`kvchat ask PATH QUESTION`: read a document, keep what the question needs, stream the answer."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from kvchat.cli.options import CACHE_TYPE_K, CACHE_TYPE_V, FLASH_ATTN, GPU_LAYERS, kv_layout, warn_about_gpu_layers
from kvchat.cli.render import render
from kvchat.documents import load_document
from kvchat.engine import DEFAULT_MAX_TOKENS, AskSettings, Engine, StreamSettings
from kvchat.cli.interrupt import interrupt_as_cancel
from kvchat.errors import CancelledError, SettingsError
from kvchat.llama import SamplerSettings
from kvchat.policy import DEFAULT_BUDGET, DEFAULT_WINDOW, HeadReduction, SnapKV, method_named, methods_help


def _question(text: str) -> str:
    if not text.strip():
        raise SettingsError("the question is empty", 'ask something, e.g. "What is the termination clause?"')
    return text


def ask_command(
    path: Path = typer.Argument(..., help="The document: PDF, TXT, Markdown or HTML."),
    question: str = typer.Argument(..., help="What to ask about it."),
    model: str = typer.Option("default", "--model", "-m", help="Registry name (see `kvchat models`) or a GGUF path."),
    budget: int = typer.Option(DEFAULT_BUDGET, help="KV entries kept for the prompt, observation window included."),
    window: int = typer.Option(DEFAULT_WINDOW, help="Observation window: the last prompt tokens whose attention votes."),
    kernel: int = typer.Option(7, help="Pooling kernel (odd) that keeps neighbours of chosen tokens."),
    pool: str = typer.Option("max", help="Pooling: max or avg."),
    heads: HeadReduction = typer.Option(HeadReduction.SUM, help="How votes of all heads become one score."),
    spans: bool = typer.Option(True, help="Keep whole numbers and words once one of their tokens is chosen."),
    method: str = typer.Option(SnapKV.name, help=methods_help()),
    chunk: int = typer.Option(StreamSettings.chunk, help="snapstream: tokens read between evictions."),
    recent: int = typer.Option(StreamSettings.recent, help="snapstream: most recent tokens always kept while reading."),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy (deterministic)."),
    seed: int | None = typer.Option(None, help="Sampling seed (with --temperature > 0)."),
    threads: int | None = typer.Option(None, help="CPU threads (default: all cores)."),
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    n_ctx: int | None = typer.Option(None, help="Context size (default: fits the prompt + max tokens)."),
    select: str = typer.Option(
        "question", help="question: select for this question; document: one query-agnostic selection."
    ),
    cache: bool = typer.Option(True, help="Save the document's reading and reuse it on the next question."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the answer and stats."),
) -> None:
    """Ask a question about a document; the answer streams to stdout, stats to stderr."""
    console = Console(stderr=True)
    warn_about_gpu_layers(gpu_layers, console)
    settings = AskSettings(
        method=method_named(method, budget=budget, window=window, kernel=kernel, pool=pool, heads=heads, spans=spans),
        max_tokens=max_tokens,
        sampler=SamplerSettings(temperature=temperature, seed=seed),
        n_ctx=n_ctx,
        threads=threads,
        layout=kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v),
    )
    stream = StreamSettings(chunk=chunk, recent=recent)
    document = load_document(path)
    question = _question(question)
    if select not in ("question", "document"):
        raise SettingsError(f"unknown selection {select!r}", "use --select question or --select document")
    with Engine(model, gpu_layers=gpu_layers, use_cache=cache) as engine, interrupt_as_cancel() as cancel:
        events = engine.ask(document, question, settings, cancel, select, stream)  # type: ignore[arg-type]
        render(events, as_json, console)
    if cancel.is_set():
        raise CancelledError("stopped", "")
