"""`kvchat cache list|stop|clear`: the saved document readings, and those in progress."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchat.cli.background import log_path
from kvchat.errors import printable
from kvchat.engine import InProgress, ReadingsInProgress, Survey, part_store, readings_in_progress, state_store

cache_app = typer.Typer(help="Saved document readings (so a second question skips reading).", no_args_is_help=True)


@cache_app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List saved readings, most recently used first, with what each costs a token of its document
    (a passage bank, "(passages)", is saved packed: about 0.4 of what a whole reading costs)."""
    store, parts = state_store(), part_store()
    entries, part_entries = store.entries(), parts.entries()
    reading = _surveyed(readings_in_progress()).live
    if as_json:
        rows = [
            {"state": state, "file": str(e.path), "document": e.header.document, "model": e.header.model,
             "tokens": e.header.n_tokens, "bytes": e.size, "bytes_per_token": round(e.size / max(e.header.n_tokens, 1)),
             "last_used": e.last_used}
            for state, listed in (("saved", entries), ("part", part_entries)) for e in listed
        ] + [
            {"state": "queued" if r.queued else "reading", "document": r.document, "model": r.model, "tokens": r.total, "done": r.done,
             "left_s": r.left_s, "pid": r.pid, "started": r.started}
            for r in reading
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=Text(f"saved readings in {store.root}", style="table.title"))
    for column in ("document", "model", "tokens", "size", "a token", "last used"):
        table.add_column(column)
    for entry in entries:
        table.add_row(
            Text(printable(entry.header.document)), Text(printable(entry.header.model)), f"{entry.header.n_tokens:,}",  # names as typed, not markup
            f"{entry.size / 2**20:,.1f} MiB", f"{entry.size / max(entry.header.n_tokens, 1) / 2**10:,.1f} KiB",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used)),
        )
    console = Console()
    console.print(table)
    total = sum(entry.size for entry in entries)
    console.print(f"{len(entries)} saved, {total / 2**20:,.1f} MiB of {store.max_bytes / 2**30:,.0f} GiB")
    if part_entries:
        part_bytes = sum(entry.size for entry in part_entries)
        console.print(f"and {len(part_entries)} parts read for questions about whole documents, {part_bytes / 2**20:,.1f} MiB "
                      f"of their own {parts.max_bytes / 2**30:,.0f} GiB")
    if reading:
        console.print(_in_progress_table(reading))
        console.print(f"kvchat cache stop stops them; what went wrong in one is in {log_path()}", markup=False, soft_wrap=True)


def _in_progress_table(reading: list[InProgress]) -> Table:
    table = Table(title=Text("reading in the background", style="table.title"))
    for column in ("document", "model", "read", "left", "process"):
        table.add_column(column)
    for entry in reading:
        share = f"{entry.done:,} of {entry.total:,} tokens ({entry.done / max(entry.total, 1):.0%})"
        left = "after the reading before it" if entry.queued else f"about {entry.left_s:.0f} s" if entry.left_s is not None else "starting"
        table.add_row(Text(printable(entry.document)), Text(printable(entry.model)), share, left, str(entry.pid))
    return table


@cache_app.command("stop")
def stop_command() -> None:
    """Stop the readings in progress in the background (those saved stay)."""
    readings = readings_in_progress()
    survey = _surveyed(readings)
    for entry in readings.stop(survey):
        typer.echo(f"stopped the reading of {printable(entry.document)} ({entry.done:,} of {entry.total:,} tokens read)")
    for entry in (entry for entry in survey.live if not entry.stoppable):
        typer.echo(f"left the reading of {printable(entry.document)} to the question, chat or server reading it (process {entry.pid})")
    if not survey.live:
        typer.echo("no reading in progress")


def _surveyed(readings: ReadingsInProgress) -> Survey:
    """The readings in progress; each record removed as not kvchat's is told on stderr."""
    survey = readings.survey()
    for line in survey.removed:
        typer.echo(f"kvchat: {line}", err=True)
    return survey


@cache_app.command("clear")
def clear_command() -> None:
    """Delete every saved reading (the parts' of whole-document questions too)."""
    freed = state_store().clear() + part_store().clear()
    typer.echo(f"freed {freed / 2**20:,.1f} MiB")
