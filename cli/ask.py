"""`kvchat ask PATH... QUESTION`: read the documents, keep what the question needs, stream the answer."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from kvchat.cli.interrupt import interrupt_as_cancel, signals_stop_reading
from kvchat.cli.options import (
    BUDGET, CACHE_TYPE_K, CACHE_TYPE_V, DRAFT, FLASH_ATTN, GPU_LAYERS, HEADS, MAX_TOKENS, METHOD, MODEL, READ,
    SAVE_READINGS, SOURCES, TEMPERATURE, THREADS, WINDOW, ask_settings, check_draft, draft_for, kv_layout,
    warn_about_gpu_layers,
)
from kvchat.cli.render import OcrBar, render
from kvchat.documents import SUPPORTED, bundle, load_document
from kvchat.engine import Engine, StreamSettings, selection_named, selections_help
from kvchat.errors import CancelledError, SettingsError
from kvchat.policy import HeadReduction, SnapKV

SNAPKV = SnapKV()  # the defaults of its options


def _question(text: str) -> str:
    if not text.strip():
        raise SettingsError("the question is empty", 'ask something, e.g. "What is the termination clause?"')
    return text


def ask_command(
    paths: list[Path] = typer.Argument(..., help=f"The document, or several asked about together: {SUPPORTED}; - reads one from standard input.", show_default=False),
    question: str = typer.Argument(..., help="What to ask about it (them)."),
    model: str = MODEL,
    budget: int = BUDGET,
    window: int = WINDOW,
    kernel: int | None = typer.Option(
        None, show_default=False, help=f"snapkv, snapstream: pooling kernel (odd) that keeps neighbours of chosen tokens (default {SNAPKV.kernel})."),
    pool: str | None = typer.Option(None, show_default=False, help=f"snapkv, snapstream: pooling, max or avg (default {SNAPKV.pool})."),
    heads: HeadReduction | None = HEADS,
    spans: str | None = typer.Option(
        None, show_default=False, help=f"snapkv, snapstream: keep whole spans once one of their tokens is chosen: words "
        f"(numbers and words), sentences, chunks (32 tokens), or none (default {SNAPKV.spans})."),
    method: str | None = METHOD,
    chunk: int = typer.Option(StreamSettings.chunk, help="snapstream: tokens read between evictions."),
    recent: int = typer.Option(StreamSettings.recent, help="snapstream: most recent tokens always kept while reading."),
    max_tokens: int = MAX_TOKENS,
    temperature: float = TEMPERATURE,
    seed: int | None = typer.Option(None, help="Sampling seed (with --temperature > 0)."),
    threads: int | None = THREADS,
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    n_ctx: int | None = typer.Option(None, help="Context size (default: fits the prompt + max tokens)."),
    select: str = typer.Option("question", help=selections_help()),
    cache: bool = SAVE_READINGS,
    sources: bool = SOURCES,
    read: str = READ,
    draft: str | None = DRAFT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the answer and stats."),
) -> None:
    """Ask a question about a document (or several: `kvchat ask a.pdf b.docx "…"`); the answer
    streams to stdout, stats to stderr."""
    console = Console(stderr=True)
    warn_about_gpu_layers(gpu_layers, console)
    layout = kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v)
    settings = ask_settings(method, layout, max_tokens, temperature, threads, seed, n_ctx, sources, read,
                            budget=budget, window=window, kernel=kernel, pool=pool, heads=heads, spans=spans)
    check_draft(draft, settings.read)
    draft = draft_for(model, draft, settings.read)
    stream = StreamSettings(chunk=chunk, recent=recent)
    selection = selection_named(select)
    with OcrBar(console) as ocr_progress, signals_stop_reading() as stop:
        document = bundle([load_document(path, ocr_progress, stop) for path in paths])
    question = _question(question)
    with Engine(model, gpu_layers=gpu_layers, use_cache=cache, draft=draft) as engine, interrupt_as_cancel() as cancel:
        render(engine.ask(document, question, settings, cancel, selection, stream), as_json, console)
    if cancel.is_set():
        raise CancelledError("stopped", "")
