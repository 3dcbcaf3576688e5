"""`kvchat read PATH...`: read documents whole and save their readings, so that every later
question about them (ask, chat, serve) loads the reading instead of reading."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer
from rich.console import Console

from kvchat.cli.background import NICENESS, lower_priority, take_job
from kvchat.cli.files import files_named
from kvchat.cli.interrupt import interrupt_as_cancel, signals_stop_reading
from kvchat.cli.options import MODEL, with_settings
from kvchat.cli.render import OcrBar, ReadingBar
from kvchat.documents import SUPPORTED, Document, load_document
from kvchat.engine import WAITING_FOR_TURN, AskSettings, Engine, UserSettings, WholeReadingDone, ask_settings
from kvchat.errors import CancelledError, DocumentError, SettingsError, printable
from kvchat.events import Notice, Progress


SUMMED = {WholeReadingDone.UNSAVED: "could not be saved"}  # the summary's words, where not the ending's own


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _load(paths: list[str], console: Console) -> tuple[list[Document], int]:
    """The documents to read, and how many files were skipped or failed (one line each)."""
    documents: list[Document] = []
    failed = 0
    with OcrBar(console) as ocr_progress, signals_stop_reading() as stop:
        for path, skipped in files_named(paths):
            if skipped is not None:
                console.print(f"skipped {printable(str(path))}: {skipped}", markup=False, highlight=False, soft_wrap=True)
                continue
            try:
                documents.append(load_document(path, ocr_progress, stop))
            except DocumentError as error:
                console.print(f"skipped {error.one_line()}", markup=False, highlight=False, soft_wrap=True)
                failed += 1
    return documents, failed


def read_documents(engine: Engine, documents: list[Document], settings: AskSettings, console: Console) -> dict[WholeReadingDone, int]:
    """Read and save each document's whole reading, saying how each ended; Ctrl-C stops the one
    being read (those done stay saved). Returns how many ended each way."""
    plans = [engine.plan(document, settings) for document in documents]
    estimates = [plan.est_read_s for plan in plans]
    total_tokens = sum(plan.tokens for plan in plans)
    if all(estimate is not None for estimate in estimates):
        said = f": about {_minutes(sum(estimates))} at this machine's last measured speed (less for those saved)"
    else:
        said = ""
    console.print(f"{len(documents)} document{'s' * (len(documents) != 1)}, {total_tokens:,} tokens{said}", highlight=False)
    ended = dict.fromkeys(WholeReadingDone, 0)
    with interrupt_as_cancel(terminate=True) as cancel:  # `kvchat cache stop` stops it too
        for document, plan in zip(documents, plans):
            started = time.perf_counter()
            bar = ReadingBar(console)
            try:
                reading = engine.read_whole(document, settings, cancel, stoppable=True)
                while True:
                    event = next(reading)
                    if isinstance(event, Progress):
                        bar.update(event)
                    elif isinstance(event, Notice):
                        console.print(f"kvchat: {event.text}", markup=False, highlight=False, soft_wrap=True)
            except StopIteration as finished:
                how = finished.value
            finally:
                bar.close()
            if cancel.is_set():
                raise CancelledError("stopped", "")
            ended[how] += 1
            took = f" ({plan.tokens:,} tokens in {_minutes(time.perf_counter() - started)})" if how is WholeReadingDone.READ else ""
            console.print(f"{printable(str(document.path))}: {how.value}{took}", markup=False, highlight=False, soft_wrap=True)
    return ended


def _read_job(job: Path) -> None:
    """A background reading that `kvchat ask` started (background.py): low priority, stopped by
    SIGTERM (`kvchat cache stop`) part-way through a batch, saving nothing then. Its stderr is the
    background log: one line when it begins to read, one when it ends (and one before them where
    its session's scheduling group could not be lowered)."""
    document, model, gpu_layers, settings, later = take_job(job)
    not_lowered = lower_priority()

    def log(line: str) -> None:
        typer.echo(f"{time.strftime('%F %T')} pid {os.getpid()}: {printable(line)}", err=True)

    if not_lowered:
        log(f"reading at niceness {NICENESS}, but {not_lowered}")

    def paused(waits: bool) -> None:
        log(f"paused reading {document.path} while a question is answered" if waits
            else f"went on reading {document.path} after the question was answered")

    began = False  # "reading" is logged once, when the reading (not a wait for another's) begins
    with Engine(model, gpu_layers=gpu_layers) as engine, interrupt_as_cancel(terminate=True) as cancel:
        reading = engine.read_later(document, settings, later, cancel, in_turn=True, stoppable=True)  # one background reading at a time
        events = engine.foreground.giving_way(reading, cancel, paused)
        try:
            while True:
                event = next(events)
                if isinstance(event, Notice):
                    log(event.text)
                    began = began or event.text != WAITING_FOR_TURN  # a wait for another process's reading: its progress is that one's
                elif isinstance(event, Progress) and not began:
                    log(f"reading {document.path}")
                    began = True
        except StopIteration as finished:
            log(f"{document.path}: {finished.value.value}")


@with_settings("threads", "gpu_layers", "flash_attn", "cache_type_k", "cache_type_v", "system")
def read_command(
    paths: list[str] = typer.Argument(None, help=f"Documents ({SUPPORTED}), folders or globs.", show_default=False),
    model: str = MODEL,
    job: Path | None = typer.Option(None, hidden=True),
    user: UserSettings = UserSettings(),
) -> None:
    """Read documents whole now and save their readings: every later question about them loads
    the reading (about a second) instead of reading."""
    if job is not None:
        _read_job(job)
        return
    if not paths:
        raise SettingsError("no documents named", f"name {SUPPORTED} files, folders or globs: kvchat read contracts/")
    console = Console(stderr=True)
    settings = ask_settings(user.model_copy(update={"read": "full"}))
    documents, failed = _load(paths, console)
    if not documents:
        raise SettingsError("nothing to read", f"name {SUPPORTED} files or folders holding them")
    with Engine(model, gpu_layers=user.gpu_layers) as engine:
        ended = read_documents(engine, documents, settings, console)
    parts = [f"{count} {SUMMED.get(how, how.value)}" for how, count in ended.items() if count]
    console.print("; ".join(parts) + (f"; {failed} could not be read" if failed else ""), highlight=False)
    if failed or ended[WholeReadingDone.UNSAVED]:  # read's only purpose is the saved reading
        raise typer.Exit(1)
