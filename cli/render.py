"""Render the engine's events: answer text to stdout, progress and stats to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import asdict

from rich.console import Console
from rich.progress import (
    BarColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

from kvchat.errors import printable
from kvchat.events import Done, Event, Notice, Progress as ReadProgress, Pruned, Stats, Token

MIB = 2**20
JSON_KEYS = (
    "answer", "model", "method", "budget", "prompt_tokens", "loaded_tokens", "read_tokens", "kept_tokens", "kv_bytes_full",
    "kv_bytes_kept", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "total_s", "read", "kept_by_document", "sources",
)


def stats_line(stats: Stats) -> str:
    read = f"read {stats.read} · " if stats.read != "full" else ""
    return read + (
        f"prompt {stats.prompt_tokens:,} tok · kept {stats.kept_tokens:,} ({stats.compression:.1f}x) · "
        f"KV {stats.kv_bytes_full / MIB:.1f} → {stats.kv_bytes_kept / MIB:.1f} MiB · "
        f"prefill {stats.prefill_tokens_per_s:.0f} tok/s · decode {_decode_speed(stats)} · "
        f"TTFT {stats.ttft_s:.2f} s · peak {stats.peak_cells:,} cells"
    )


def _decode_speed(stats: Stats) -> str:
    """Tokens a second after the first, or "–" (as the chat shows it) for an answer of one token."""
    return f"{stats.decode_tokens_per_s:.1f} tok/s" if stats.decode_tokens_per_s else "–"


def json_record(done: Done, kept_by_document: tuple[tuple[str, int], ...]) -> dict[str, object]:
    stats = done.stats
    record: dict[str, object] = {"answer": done.answer}
    record.update({key: getattr(stats, key) for key in JSON_KEYS if key not in ("answer", "kept_by_document", "sources")})
    record["kept_by_document"] = dict(kept_by_document)  # characters of each document kept; {} for one document
    record["sources"] = [asdict(source) for source in done.sources]  # start, end: offsets into the document's text
    return record


def kept_by_document_line(kept_by_document: tuple[tuple[str, int], ...]) -> str:
    return "kept of each document: " + " · ".join(f"{printable(name)} {chars:,} chars" for name, chars in kept_by_document)


class _Bar:
    """A transient progress bar on stderr, drawn only on a terminal, from its first update on."""

    def __init__(self, console: Console, *columns: ProgressColumn) -> None:
        self._progress = Progress(*columns, TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                  console=console, transient=True)
        self._task: TaskID | None = None

    def _show(self, done: int, total: int, **fields: object) -> None:
        if not self._progress.console.is_terminal:
            return
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("", total=total, **fields)
        self._progress.update(self._task, completed=done, **fields)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()
            self._task = None


class ReadingBar(_Bar):
    """The prompt's tokens read, with tokens/s and ETA."""

    def __init__(self, console: Console) -> None:
        super().__init__(console, TextColumn("reading"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} tok"),
                         TextColumn("{task.fields[rate]:>6.0f} tok/s"))

    def update(self, event: ReadProgress) -> None:
        self._show(event.done, event.total, rate=event.tokens_per_s)


class OcrBar(_Bar):
    """The scanned pages of a PDF read by OCR: load_document's progress callback, closed on exit."""

    def __init__(self, console: Console) -> None:
        super().__init__(console, TextColumn("OCR"), BarColumn(), TextColumn("{task.completed}/{task.total} pages"))

    def __call__(self, done: int, total: int) -> None:
        self._show(done, total)

    def __enter__(self) -> OcrBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def render(events: Iterable[Event], as_json: bool, console: Console) -> Done | None:
    """Consume the event stream; returns the Done event.

    The answer streams to stdout as text for reading, its control characters but newline and tab
    shown as visible stand-ins (errors.printable: ␛ for ESC), whether stdout is a terminal or a
    pipe, for a pipe often ends at one (`| less -R`, `| tee`); a character at a time, so a
    sequence split across tokens is caught as well. `--json` is the answer as the model wrote it,
    for programs: JSON escapes its control characters (\\u001b)."""
    bar = ReadingBar(console)
    done: Done | None = None
    kept_by_document: tuple[tuple[str, int], ...] = ()
    wrote_text = False
    try:
        for event in events:
            if isinstance(event, ReadProgress) and not wrote_text:  # an answer in parts goes on reading: its text says where
                bar.update(event)
            elif isinstance(event, Pruned):
                bar.close()
                kept_by_document = event.kept_by_document
            elif isinstance(event, Notice):
                console.print(f"kvchat: {event.text}", highlight=False, markup=False, soft_wrap=True)
            elif isinstance(event, Token):
                bar.close()
                if not as_json:
                    sys.stdout.write(printable(event.text, lines=True))
                    sys.stdout.flush()
                    wrote_text = True
            elif isinstance(event, Done):
                done = event
    finally:
        bar.close()
        if wrote_text:
            sys.stdout.write("\n")
            sys.stdout.flush()
    if done is not None:
        if as_json:
            sys.stdout.write(json.dumps(json_record(done, kept_by_document)) + "\n")
        for source in done.sources:
            console.print(printable(source.quoted()), highlight=False, markup=False, soft_wrap=True)
        console.print(stats_line(done.stats), highlight=False, soft_wrap=True)
        if kept_by_document:
            console.print(kept_by_document_line(kept_by_document), highlight=False, markup=False, soft_wrap=True)
    return done
