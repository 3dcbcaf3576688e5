"""The chat screen's parts: the live KV panel, the reading bar and the transcript entries (a
question, its answer and the answer's sources)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Markdown, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from kvchat.documents import Document
from kvchat.engine import AskSettings
from kvchat.errors import printable
from kvchat.events import Progress, Pruned, Source, Stats

MIB = 2**20


@dataclass
class KvFigures:
    """What the side panel shows; None = not known yet."""

    document: str = "no document"
    document_tokens: int | None = None
    pages: int | None = None
    cells: int | None = None
    prompt_tokens: int | None = None
    kv_kept_bytes: int | None = None
    kv_full_bytes: int | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    ttft_s: float | None = None
    read: str = "full"  # how the last answer's prompt was read ("fast 12/24": by the first 12 of 24 layers)
    later_reading: str | None = None  # after a fast answer, the reading for the follow-ups (its passages, or whole) in the background


def _count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def _figure(value: float | None, unit: str, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f} {unit}"


class KvPanel(Static):
    """Live KV figures: cells used vs budget, compression, KiB kept vs full, speeds, TTFT."""

    def __init__(self, settings: AskSettings, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.figures = KvFigures()
        self.settings = settings

    def on_mount(self) -> None:
        self.refresh_figures()

    def refresh_figures(self) -> None:
        figures, settings = self.figures, self.settings
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold")
        table.add_column(justify="right")
        budget = settings.method.budget if settings.method.prunes else None
        ratio = (
            f"{figures.prompt_tokens / figures.cells:.1f}x"
            if figures.cells and figures.prompt_tokens
            else "–"
        )
        kept_mib = None if figures.kv_kept_bytes is None else figures.kv_kept_bytes / MIB
        full_mib = None if figures.kv_full_bytes is None else figures.kv_full_bytes / MIB
        rows = [
            ("Document", Text(figures.document, overflow="ellipsis", no_wrap=True)),
            ("tokens", _count(figures.document_tokens)),
            ("pages", _count(figures.pages)),
            ("", ""),
            ("KV cache", ""),
            ("cells", f"{_count(figures.cells)} / {_count(budget) if budget else 'all'}"),
            ("compression", ratio),
            ("kept", _figure(kept_mib, "MiB")),
            ("full", _figure(full_mib, "MiB")),
            ("", ""),
            ("Speed", ""),
            ("prefill", _figure(figures.prefill_tps, "tok/s", 0)),
            ("decode", _figure(figures.decode_tps, "tok/s")),
            ("TTFT", _figure(figures.ttft_s, "s", 2)),
            *([("read", figures.read)] if figures.read != "full" else []),
            *([("for follow-ups", figures.later_reading)] if figures.later_reading else []),
            ("", ""),
            ("Settings", ""),
            ("method", settings.method.name),
            ("budget", f"{settings.method.budget:,}"),
            ("window", str(settings.method.window)),
            ("max tokens", f"{settings.max_tokens:,}"),
        ]
        for name, value in rows:
            table.add_row(name, value)
        self.update(table)

    def show_stats(self, stats: Stats) -> None:
        figures = self.figures
        figures.cells, figures.prompt_tokens = stats.kept_tokens, stats.prompt_tokens
        figures.kv_kept_bytes, figures.kv_full_bytes = stats.kv_bytes_kept, stats.kv_bytes_full
        figures.ttft_s, figures.read = stats.ttft_s, stats.read
        if stats.generated_tokens > 1:  # a one-token answer has no decode speed
            figures.decode_tps = stats.decode_tokens_per_s
        if stats.prefill_tokens_per_s:
            figures.prefill_tps = stats.prefill_tokens_per_s
        self.refresh_figures()


class ReadingBar(Horizontal):
    """Reading progress with tokens/s and ETA; hidden when nothing is being read."""

    def compose(self) -> ComposeResult:
        yield Label("Reading", id="reading-label")
        yield ProgressBar(show_eta=True, id="reading-progress")
        yield Label("", id="reading-speed")

    def start(self, title: str) -> None:
        self.query_one("#reading-label", Label).update(title)
        self.query_one(ProgressBar).update(total=None, progress=0)
        self.query_one("#reading-speed", Label).update("")
        self.display = True

    def show(self, progress: Progress) -> None:
        self.query_one(ProgressBar).update(total=max(progress.total, 1), progress=progress.done)
        self.query_one("#reading-speed", Label).update(f"{progress.done:,}/{progress.total:,} tok · {progress.tokens_per_s:,.0f} tok/s")

    def show_pages(self, done: int, total: int) -> None:
        """OCR of scanned pages, before the reading proper."""
        self.query_one("#reading-label", Label).update("OCR")
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        self.query_one("#reading-speed", Label).update(f"{done:,}/{total:,} pages")

    def stop(self) -> None:
        self.display = False


class QuestionView(Static):
    """One question in the transcript."""


class AnswerView(Markdown):
    """One answer in the transcript, streamed in as Markdown."""


class Exchange(Vertical):
    """A question and its answer, mounted into the transcript as one widget."""

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question
        self.answer = AnswerView()

    def compose(self) -> ComposeResult:
        yield QuestionView(f"› {self.question}", markup=False)
        yield self.answer


class SourceList(OptionList):
    """The passages an answer drew on, under it; choosing one shows it in the document the
    answer was about, with what that answer's selection kept (`kept`; None: nothing was pruned)."""

    def __init__(self, sources: Sequence[Source], document: Document, kept: Pruned | None) -> None:
        super().__init__(*(Option(Text(printable(source.quoted()))) for source in sources))
        self.sources, self.document, self.kept = tuple(sources), document, kept


class NoticeView(Static):
    """A line from kvchat in the transcript (a saved reading was loaded, an answer was stopped)."""
