"""`kvchat chat [PATH...]`: the terminal UI for a conversation with a document, or several."""

from __future__ import annotations

from pathlib import Path

import typer

from kvchat.cli.options import (
    BUDGET, CACHE_TYPE_K, CACHE_TYPE_V, DRAFT, FLASH_ATTN, GPU_LAYERS, HEADS, METHOD, MODEL, N_BATCH, SAVE_READINGS, TEMPERATURE,
    THREADS, WINDOW, ask_settings, check_draft, draft_for, gpu_layers_warning, kv_layout, with_settings,
)
from kvchat.documents import SUPPORTED
from kvchat.engine import UserSettings
from kvchat.policy import HeadReduction


@with_settings("read", "in_parts", "max_tokens", "system")
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
    temperature: float = TEMPERATURE,
    threads: int | None = THREADS,
    n_batch: int = N_BATCH,
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    cache: bool = SAVE_READINGS,
    draft: str | None = DRAFT,
    user: UserSettings = UserSettings(),
) -> None:
    """Chat with a document in a terminal UI (F1 inside lists the keys)."""
    layout = kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v)
    settings = ask_settings(user, method, layout, temperature, threads, n_batch=n_batch, budget=budget, window=window, heads=heads)
    from kvchat.tui.app import KvchatApp  # Textual is imported only for this command
    from kvchat.tui.sessions import EngineSessions

    check_draft(draft, settings.read)
    draft = draft_for(model, draft, settings.read)
    app = KvchatApp(EngineSessions(model, gpu_layers, cache, draft), paths or [], settings, startup_warning=gpu_layers_warning(gpu_layers))
    try:
        app.run()
    finally:
        app.close_engine()
