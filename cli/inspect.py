"""`kvchat inspect PATH...`: what kvchat will read, and how, before reading it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchat.cli.interrupt import signals_stop_reading
from kvchat.cli.options import MODEL, check_draft, with_settings
from kvchat.cli.render import OcrBar
from kvchat.documents import SUPPORTED, load_document
from kvchat.engine import AskSettings, Engine, ReadingPlan, UserSettings, draft_at_start, draft_for
from kvchat.errors import printable


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _table(plans: list[ReadingPlan], model: str, n_ctx_train: int) -> Table:
    table = Table(title=Text(f"kvchat inspect · model {model}, trained on {n_ctx_train:,} tokens", style="table.title"))
    for column in ("document", "format", "pages", "chars", "tokens", "fits", "method", "first answer", "then read"):
        table.add_column(column, justify="right" if column in ("pages", "chars", "tokens") else "left")
    for plan in plans:
        first = f"fast, {_duration(plan.est_fast_s)}" if plan.reads_fast else f"whole, {_duration(plan.est_read_s)}"
        if not plan.reads_fast:
            then = "nothing more"
        elif plan.later_reading is None:
            then = "nothing: every question reads fast"
        else:
            then = f"{plan.later_reading}, {_duration(plan.est_later_s)}"
        table.add_row(Text(printable(Path(plan.path).name)), plan.format, f"{plan.pages:,}", f"{plan.chars:,}", f"{plan.tokens:,}",
                      "yes" if plan.fits_context else "no", plan.method, first, then)
    return table


@with_settings("gpu_layers", "draft", "read")
def inspect_command(
    paths: list[Path] = typer.Argument(..., help=f"The documents: {SUPPORTED}; - reads one from standard input."),
    model: str = MODEL,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per document."),
    user: UserSettings = UserSettings(),
) -> None:
    """Show each document's format, pages, size in the model's tokens, whether it fits the model's
    context (and so how it will be read), and how long the first answer's reading (fast, by
    default) and the reading that follows it in the background for the questions after (the
    document's passages by default, or whole) will take on this machine."""
    console = Console(stderr=True)
    settings = AskSettings(read=user.read)
    check_draft(user.draft, settings.read)
    with OcrBar(console) as ocr_progress, signals_stop_reading() as stop:
        documents = [load_document(path, ocr_progress, stop) for path in paths]
    with Engine(model, gpu_layers=user.gpu_layers, draft=draft_for(model, user.draft, settings.read),
                draft_at_start=draft_at_start(user.draft, settings.read)) as engine:  # the cache holds the speeds
        plans = [engine.plan(document, settings) for document in documents]
        n_ctx_train = engine.model.shape.n_ctx_train
    if as_json:
        typer.echo(json.dumps([plan.as_json() for plan in plans], indent=2))
        return
    output = Console()
    if not output.is_terminal:
        output.width = 140  # files and pipes get the whole table, not 80 columns
    output.print(_table(plans, model, n_ctx_train))
    if any(plan.est_read_s is None or (plan.reads_fast and plan.est_fast_s is None) for plan in plans):
        output.print("Reading times come from this machine's last long reading of each kind with this model; unknown "
                     "until it has read a document of 512 tokens or more that way.", soft_wrap=True)
