"""`kvchat chat [PATH]`: the terminal UI for a conversation with a document."""

from __future__ import annotations

from pathlib import Path

import typer

from kvchat.cli.options import CACHE_TYPE_K, CACHE_TYPE_V, FLASH_ATTN, GPU_LAYERS, gpu_layers_warning, kv_layout
from kvchat.engine import DEFAULT_MAX_TOKENS, AskSettings
from kvchat.llama import SamplerSettings
from kvchat.policy import DEFAULT_BUDGET, DEFAULT_WINDOW, SnapKV, method_named, methods_help


def chat_command(
    path: Path | None = typer.Argument(None, help="The document (PDF, TXT, Markdown or HTML); a file picker opens without one."),
    model: str = typer.Option("default", "--model", "-m", help="Registry name (see `kvchat models`) or a GGUF path."),
    budget: int = typer.Option(DEFAULT_BUDGET, help="KV entries kept for the prompt, observation window included."),
    window: int = typer.Option(DEFAULT_WINDOW, help="Observation window: the question's last tokens whose attention votes."),
    method: str = typer.Option(SnapKV.name, help=methods_help()),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, help="Most tokens per answer."),
    temperature: float = typer.Option(0.0, help="0 = greedy (deterministic)."),
    threads: int | None = typer.Option(None, help="CPU threads (default: all cores)."),
    gpu_layers: int = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    cache: bool = typer.Option(True, help="Save each document's reading and reuse it next time."),
) -> None:
    """Chat with a document in a terminal UI (F1 inside lists the keys)."""
    settings = AskSettings(
        method=method_named(method, budget=budget, window=window),
        max_tokens=max_tokens,
        sampler=SamplerSettings(temperature=temperature),
        threads=threads,
        layout=kv_layout(flash_attn, gpu_layers, cache_type_k, cache_type_v),
    )
    from kvchat.tui.app import KvchatApp  # Textual is imported only for this command
    from kvchat.tui.sessions import EngineSessions

    app = KvchatApp(EngineSessions(model, gpu_layers, cache), path, settings, startup_warning=gpu_layers_warning(gpu_layers))
    try:
        app.run()
    finally:
        app.close_engine()
