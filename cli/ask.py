"""`kvchat ask PATH... QUESTION`: read the documents, keep what the question needs, stream the answer."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import typer
from rich.console import Console

from kvchat.cli.background import background_reading_on, log_path, start_background_reading
from kvchat.cli.interrupt import interrupt_as_cancel, signals_stop_reading
from kvchat.cli.options import MODEL, as_text, check_draft, warn_about_gpu_layers, with_settings
from kvchat.cli.render import OcrBar, render
from kvchat.cli.resident import DEFAULT_KEEP_ALIVE_S, KEEP_ALIVE_ENV, Kept, asked_of_kept, keep_alive_s, start_kept
from kvchat.cli.files import files_named
from kvchat.documents import SUPPORTED, Document, bundle, load_document
from kvchat.engine import Engine, UserSettings, ask_settings, draft_at_start, draft_for, readings_in_progress, setting_names
from kvchat.errors import CancelledError, DocumentError, SettingsError, printable
from kvchat.events import LaterReading
from kvchat.paths import cache_dir, checked_writable

# what the line after an answer says the background reading reads (Done.read_later)
_LATER = {LaterReading.PASSAGES: "reading the document's passages", LaterReading.WHOLE: "reading the whole document"}


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


def _keep_loaded(kept: Kept, keep_s: int, console: Console) -> None:
    """Leave the model loaded for the next ask (resident.py); the answer stands if it cannot be."""
    try:
        start_kept(kept, keep_s, log_path())
    except OSError as error:
        _tell(console, f"could not keep the model loaded for the next question ({error})")


def _tell(console: Console, line: str) -> None:
    console.print(f"kvchat: {printable(line)}", markup=False, highlight=False, soft_wrap=True)


@with_settings(*setting_names())
def ask_command(
    paths: list[Path] = typer.Argument(
        None, help=f"The document, or several asked about together: {SUPPORTED}, folders of them, globs; - reads one "
        "from standard input.", show_default=False),
    question: str = typer.Argument(None, help="What to ask about it (them).", show_default=False, callback=as_text),
    model: str = MODEL,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the answer and stats."),
    keep_alive: int | None = typer.Option(
        None, "--keep-alive", min=0, show_default=False,
        help=f"Seconds the model stays loaded after the answer, for the next ask (default {DEFAULT_KEEP_ALIVE_S}, or "
        f"{KEEP_ALIVE_ENV}); 0: not at all."),
    user: UserSettings = UserSettings(),
) -> None:
    """Ask a question about a document (or several: `kvchat ask a.pdf b.docx "…"`); the answer
    streams to stdout, stats to stderr."""
    names, question = _question(paths, question)
    console = Console(stderr=True)
    warn_about_gpu_layers(user.gpu_layers, console)
    settings = ask_settings(user)
    check_draft(user.draft, settings.read)
    if user.cache:  # said now, not once the documents are read
        checked_writable(cache_dir(), also="ask with --no-cache")
    draft = draft_for(model, user.draft, settings.read)
    cache, gpu_layers = user.cache, user.gpu_layers
    in_background = cache and background_reading_on()
    kept, keep_s = Kept(model, gpu_layers, cache, draft, draft_at_start(user.draft, settings.read)), keep_alive_s(keep_alive)
    # background readings pause from now on: the document's loading and the models' are the question's too
    with readings_in_progress().foreground.answering(told=lambda line: _tell(console, f"{line}, or press Ctrl-C to stop")):
        document = _load(names, console)
        with interrupt_as_cancel() as cancel:
            events = asked_of_kept(kept, document, question, settings, keep_s, cancel)
            answered_here = events is None
            if events is not None:
                with closing(events):
                    done = render(events, as_json, console)
        if answered_here:
            with Engine(model, gpu_layers=gpu_layers, use_cache=cache, draft=draft,
                        draft_at_start=kept.draft_at_start) as engine, interrupt_as_cancel() as cancel:
                # closed here, whatever render() raises: the conversation's context goes before the model
                with closing(engine.ask(document, question, settings, cancel=cancel)) as events:
                    done = render(events, as_json, console)
    if cancel.is_set():
        raise CancelledError("stopped", "")
    if answered_here and keep_s:
        _keep_loaded(kept, keep_s, console)
    if done is not None and done.read_later and in_background:
        try:
            start_background_reading(document, model, settings, gpu_layers, done.read_later)
        except OSError as error:  # the answer stands; only the next question's wait is at stake
            console.print(f"kvchat: could not start reading the document in the background ({error})",
                          markup=False, highlight=False, soft_wrap=True)
            return
        console.print(f"{_LATER[done.read_later]} in the background, so that the next question loads it "
                      "(kvchat cache list shows it, kvchat cache stop stops it)", highlight=False, soft_wrap=True)
