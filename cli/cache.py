"""`kvchat cache list|clear`: the saved document readings."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchat.engine import state_store

cache_app = typer.Typer(help="Saved document readings (so a second question skips reading).", no_args_is_help=True)


@cache_app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List saved readings, most recently used first."""
    store = state_store()
    entries = store.entries()
    if as_json:
        rows = [
            {"file": str(e.path), "document": e.header.document, "model": e.header.model,
             "tokens": e.header.n_tokens, "bytes": e.size, "last_used": e.last_used}
            for e in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=Text(f"saved readings in {store.root}", style="table.title"))
    for column in ("document", "model", "tokens", "size", "last used"):
        table.add_column(column)
    for entry in entries:
        table.add_row(
            Text(entry.header.document), Text(entry.header.model), f"{entry.header.n_tokens:,}",  # names as typed, not markup
            f"{entry.size / 2**20:,.1f} MiB", time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used)),
        )
    console = Console()
    console.print(table)
    total = sum(entry.size for entry in entries)
    console.print(f"{len(entries)} saved, {total / 2**20:,.1f} MiB of {store.max_bytes / 2**30:,.0f} GiB")


@cache_app.command("clear")
def clear_command() -> None:
    """Delete every saved reading."""
    freed = state_store().clear()
    typer.echo(f"freed {freed / 2**20:,.1f} MiB")
