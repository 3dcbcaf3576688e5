"""`kvchat chat [PATH...]`: the terminal UI for a conversation with a document, or several."""

from __future__ import annotations

from pathlib import Path

import typer

from kvchat.cli.options import (
    BUDGET, N_BATCH, SYSTEM, CACHE_TYPE_K, CACHE_TYPE_V, DRAFT, FLASH_ATTN, GPU_LAYERS, HEADS, MAX_TOKENS, METHOD, MODEL, READ,
    SAVE_READINGS, WHOLE, TEMPERATURE, THREADS, WINDOW, ask_settings, check_draft, draft_for, gpu_layers_warning, kv_layout,
)
from kvchat.documents import SUPPORTED
from kvchat.policy import HeadReduction


def chat_command(
    paths: list[Path] | None = typer.Argument(
        None, help=f"The document, or several to ask about together ({SUPPORTED}); a file picker opens without one.",
        show_default=False,
    ),
    model: str = MODEL,
    budget: int = BUDGET,
    window: int = WINDOW,
    heads: HeadReduction | None = HEADS,
    method: str | None = METHOD,
    max_tokens: int = MAX_TOKENS,
    temperature: float = TEMPERATURE,
    threads: int | None = THREADS,
    n_batch: int = N_BATCH,
    system: str | None = SYSTEM,
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    cache: bool = SAVE_READINGS,
    read: str = READ,
    whole: str = WHOLE,
    draft: str | None = DRAFT,
) -> None:
    """Chat with a document in a terminal UI (F1 inside lists the keys)."""
    layout = kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v)
    settings = ask_settings(method, layout, max_tokens, temperature, threads, read=read, n_batch=n_batch, system=system, whole=whole,
                            budget=budget, window=window, heads=heads)
    from kvchat.tui.app import KvchatApp  # Textual is imported only for this command
    from kvchat.tui.sessions import EngineSessions

    check_draft(draft, settings.read)
    draft = draft_for(model, draft, settings.read)
    app = KvchatApp(EngineSessions(model, gpu_layers, cache, draft), paths or [], settings, startup_warning=gpu_layers_warning(gpu_layers))
    try:
        app.run()
    finally:
        app.close_engine()
