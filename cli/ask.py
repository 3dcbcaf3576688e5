"""`kvchat ask PATH... QUESTION`: read the documents, keep what the question needs, stream the answer."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import typer
from rich.console import Console

from kvchat.cli.background import background_reading_on, start_background_reading
from kvchat.cli.interrupt import interrupt_as_cancel, signals_stop_reading
from kvchat.cli.options import (
    ADVANCED, BUDGET, CACHE_TYPE_K, CACHE_TYPE_V, DRAFT, FLASH_ATTN, GPU_LAYERS, HEADS, METHOD, MODEL, N_BATCH, SAVE_READINGS,
    TEMPERATURE, THREADS, WINDOW, as_text, ask_settings, check_draft, draft_for, kv_layout, warn_about_gpu_layers, with_settings,
)
from kvchat.cli.render import OcrBar, render
from kvchat.cli.files import files_named
from kvchat.documents import SUPPORTED, Document, bundle, load_document
from kvchat.engine import Engine, StreamSettings, UserSettings, selection_named, selections_help
from kvchat.errors import CancelledError, DocumentError, SettingsError, printable
from kvchat.policy import HeadReduction, SnapKV

SNAPKV = SnapKV()  # the defaults of its options


def _question(paths: list[Path] | None, question: str | None) -> tuple[list[str], str]:
    """The documents named and the question; a question forgotten is named as such (click gives
    the last argument to the question, so `kvchat ask a.pdf` has a question and no document)."""
    if not paths:
        if question is None:
            raise SettingsError("no document and no question", 'kvchat ask contract.pdf "What is the termination clause?"')
        raise SettingsError(f"no question asked about {question}", f'add it: kvchat ask {question} "What is the termination clause?"')
    if question is None or not question.strip():
        raise SettingsError("the question is empty", 'ask something, e.g. "What is the termination clause?"')
    return [str(path) for path in paths], question


def _load(names: list[str], console: Console) -> Document:
    """The documents named (files, folders' documents, globs, - for standard input), as one."""
    files = []
    for path, skipped in files_named(names):
        if skipped is not None:
            console.print(f"kvchat: skipped {printable(str(path))}: {skipped}", markup=False, highlight=False, soft_wrap=True)
        else:
            files.append(path)
    if not files:
        raise DocumentError(f"{', '.join(names)}: no documents in this directory or glob",
                            f"name {SUPPORTED} files, or folders that hold some")
    with OcrBar(console) as ocr_progress, signals_stop_reading() as stop:
        return bundle([load_document(path, ocr_progress, stop) for path in files])


@with_settings("read", "in_parts", "sources", "max_tokens", "system")
def ask_command(
    paths: list[Path] = typer.Argument(
        None, help=f"The document, or several asked about together: {SUPPORTED}, folders of them, globs; - reads one "
        "from standard input.", show_default=False),
    question: str = typer.Argument(None, help="What to ask about it (them).", show_default=False, callback=as_text),
    model: str = MODEL,
    budget: int = BUDGET,
    window: int = WINDOW,
    kernel: int | None = typer.Option(
        None, show_default=False, rich_help_panel=ADVANCED, help=f"snapkv, snapstream: pooling kernel (odd) that keeps neighbours of chosen tokens (default {SNAPKV.kernel})."),
    pool: str | None = typer.Option(None, show_default=False, rich_help_panel=ADVANCED, help=f"snapkv, snapstream: pooling, max or avg (default {SNAPKV.pool})."),
    heads: HeadReduction | None = HEADS,
    spans: str | None = typer.Option(
        None, show_default=False, rich_help_panel=ADVANCED, help=f"snapkv, snapstream: keep whole spans once one of their tokens is chosen: words "
        f"(numbers and words), sentences, chunks (32 tokens), or none (default {SNAPKV.spans})."),
    method: str | None = METHOD,
    chunk: int = typer.Option(StreamSettings.chunk, rich_help_panel=ADVANCED, help="snapstream: tokens read between evictions."),
    recent: int = typer.Option(StreamSettings.recent, rich_help_panel=ADVANCED, help="snapstream: most recent tokens always kept while reading."),
    temperature: float = TEMPERATURE,
    seed: int | None = typer.Option(None, help="Sampling seed (with --temperature > 0)."),
    threads: int | None = THREADS,
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    n_ctx: int | None = typer.Option(None, "--n-ctx", "--ctx-size", "-c", help="Context size (default: fits the prompt + max tokens)."),
    n_batch: int = N_BATCH,
    select: str = typer.Option("question", rich_help_panel=ADVANCED, help=selections_help()),
    cache: bool = SAVE_READINGS,
    draft: str | None = DRAFT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the answer and stats."),
    user: UserSettings = UserSettings(),
) -> None:
    """Ask a question about a document (or several: `kvchat ask a.pdf b.docx "…"`); the answer
    streams to stdout, stats to stderr."""
    names, question = _question(paths, question)
    console = Console(stderr=True)
    warn_about_gpu_layers(gpu_layers, console)
    layout = kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v)
    settings = ask_settings(user, method, layout, temperature, threads, seed, n_ctx, n_batch,
                            budget=budget, window=window, kernel=kernel, pool=pool, heads=heads, spans=spans)
    check_draft(draft, settings.read)
    draft = draft_for(model, draft, settings.read)
    stream = StreamSettings(chunk=chunk, recent=recent)
    selection = selection_named(select)
    document = _load(names, console)
    in_background = cache and background_reading_on()
    with Engine(model, gpu_layers=gpu_layers, use_cache=cache, draft=draft) as engine, interrupt_as_cancel() as cancel:
        # closed here, whatever render() raises: the conversation's context goes before the model
        with closing(engine.ask(document, question, settings, cancel=cancel, selection=selection, stream=stream)) as events:
            done = render(events, as_json, console)
    if cancel.is_set():
        raise CancelledError("stopped", "")
    if done is not None and done.read_whole_after and in_background:
        try:
            start_background_reading(document, model, settings, gpu_layers)
        except OSError as error:  # the answer stands; only the next question's wait is at stake
            console.print(f"kvchat: could not start reading the whole document in the background ({error})",
                          markup=False, highlight=False, soft_wrap=True)
            return
        console.print("reading the whole document in the background, so the next question loads it "
                      "(kvchat cache list shows it, kvchat cache stop stops it)", highlight=False, soft_wrap=True)
