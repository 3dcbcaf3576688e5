"""Modal screens of the chat app: settings, key help, the file picker and the kept view."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DirectoryTree, Input, Label, Select, Static

from kvchat.documents import DOCUMENT_SUFFIXES
from kvchat.engine import WHOLES, AskSettings
from kvchat.errors import SettingsError
from kvchat.policy import METHODS, SnapKV, method_carrying, method_options

KEYS = [
    ("enter", "ask the question typed in the box"),
    ("esc", "stop the answer or the reading in progress"),
    ("ctrl+n", "new conversation about the same document"),
    ("ctrl+o", "open another document"),
    ("ctrl+a", "add a document: ask about it together with those open (a new conversation)"),
    ("ctrl+s", "settings: budget, window, pooling, method, sampling"),
    ("ctrl+t", "kept view: the document with what the cache kept highlighted"),
    ("? / f1", "this help"),
    ("ctrl+q", "quit"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        table = Text()
        for key, what in KEYS:
            table.append(f"{key:>8}  ", style="bold cyan")
            table.append(f"{what}\n")
        with Vertical(id="help", classes="dialog"):
            yield Label("[b]Keys[/b]")
            yield Static(table)
            yield Label("[dim]esc closes[/dim]")


class SettingsScreen(ModalScreen[AskSettings | None]):
    """Edit the settings of the next answers; refuses invalid ones with the reason."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, settings: AskSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        method, sampler = self.settings.method, self.settings.sampler
        snapkv = SnapKV()  # pooling fields show SnapKV's defaults under a method without pooling
        with Vertical(id="settings", classes="dialog"):
            yield Label("[b]Settings[/b]  (apply to the next answer)")
            with Grid(id="settings-grid"):
                yield Label("KV budget")
                yield Input(str(method.budget), type="integer", compact=True, id="budget")
                yield Label("window")
                yield Input(str(method.window), type="integer", compact=True, id="window")
                yield Label("pooling kernel")
                yield Input(str(getattr(method, "kernel", snapkv.kernel)), type="integer", compact=True, id="kernel")
                yield Label("pooling")
                yield Select([(mode, mode) for mode in ("max", "avg")], value=getattr(method, "pool", snapkv.pool), allow_blank=False, compact=True, id="pool")
                yield Label("method")
                yield Select([(m, m) for m in METHODS], value=method.name, allow_blank=False, compact=True, id="method")
                yield Label("temperature")
                yield Input(str(sampler.temperature), type="number", compact=True, id="temperature")
                yield Label("max tokens")
                yield Input(str(self.settings.max_tokens), type="integer", compact=True, id="max-tokens")
                yield Label("whole document")  # questions about it (a summary, a list) answered in parts
                yield Select([(way, way) for way in WHOLES], value=self.settings.whole, allow_blank=False, compact=True, id="whole")
            yield Label("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _number(self, widget_id: str, kind: type) -> int | float:
        text = self.query_one(f"#{widget_id}", Input).value.strip()
        try:
            return kind(text)
        except ValueError:
            raise SettingsError(f"{widget_id.replace('-', ' ')} must be a number, got {text!r}", "") from None

    def _settings(self) -> AskSettings:
        temperature = float(self._number("temperature", float))
        if not 0 <= temperature <= 5:
            raise SettingsError(f"temperature must be between 0 and 5, got {temperature}", "")
        fields = {**method_options(self.settings.method), "kernel": int(self._number("kernel", int)),
                  "pool": self.query_one("#pool", Select).value}  # shown for every method: those it has
        method = method_carrying(  # runs the method's checks (budget >= window + sinks, odd kernel …)
            str(self.query_one("#method", Select).value), fields,
            budget=int(self._number("budget", int)), window=int(self._number("window", int)),
        )
        return replace(
            self.settings,
            method=method,
            sampler=replace(self.settings.sampler, temperature=temperature),
            max_tokens=int(self._number("max-tokens", int)),
            whole=str(self.query_one("#whole", Select).value),
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        try:
            settings = self._settings()
        except (SettingsError, ValueError) as error:
            message = error.message if isinstance(error, SettingsError) else str(error)
            self.query_one("#settings-error", Label).update(Text(message, style="red"))  # the value as typed, not markup
            return
        self.dismiss(settings)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one("#save", Button).press()


class DocumentTree(DirectoryTree):
    """Folders and the files kvchat can read; hidden entries left out. Names are shown as they
    are: a Tree reads a str label as markup, which "notes [final].txt" is not."""

    def process_label(self, label: str | Text) -> Text:
        return super().process_label(Text(label) if isinstance(label, str) else label)

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [
            path
            for path in paths
            if not path.name.startswith(".") and (path.is_dir() or path.suffix.lower() in DOCUMENT_SUFFIXES)
        ]


class PickerScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, start: Path) -> None:
        super().__init__()
        self.start = start

    def compose(self) -> ComposeResult:
        with Vertical(id="picker", classes="dialog"):
            yield Label(Text.assemble(("Open a document", "bold"), f"  {self.start}  (enter opens, esc cancels)"))
            yield DocumentTree(self.start, id="picker-tree")

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.dismiss(event.path)


class KeptScreen(ModalScreen[None]):
    """The document with the spans the last selection kept highlighted (`partial`: kept by some
    heads only, of a selection per head, in yellow); `focus`, a source of an answer, is marked
    apart and scrolled to."""

    BINDINGS = [Binding("escape,ctrl+t,q", "dismiss", "Close")]

    def __init__(
        self, text: str, spans: list[tuple[int, int]], summary: str, focus: tuple[int, int] | None = None,
        partial: list[tuple[int, int]] | None = None,
    ) -> None:
        super().__init__()
        self.text, self.spans, self.summary, self.focus, self.partial = text, spans, summary, focus, partial or []

    def compose(self) -> ComposeResult:
        body = Text(self.text, style="dim")
        for start, end in self.partial:
            body.stylize("not dim yellow", start, end)
        for start, end in self.spans:
            body.stylize("bold black on yellow", start, end)
        if self.focus is not None:
            body.stylize("bold black on green", *self.focus)
        with Vertical(id="kept", classes="dialog"):
            yield Label(Text.assemble(("Kept", "bold"), f"  {self.summary}  (esc closes)"))  # names its documents
            with VerticalScroll(id="kept-scroll"):
                yield Static(body, id="kept-text")

    def on_mount(self) -> None:
        if self.focus is not None:
            self.call_after_refresh(self._scroll_to_focus)

    def _scroll_to_focus(self) -> None:
        """Scroll so the source is near the top: its line, counting each paragraph's wrapped lines."""
        width = max(1, self.query_one("#kept-text").content_region.width)
        before = self.text[: self.focus[0]].split("\n") if self.focus else [""]
        line = sum(max(1, -(-len(paragraph) // width)) for paragraph in before[:-1]) + len(before[-1]) // width
        self.query_one("#kept-scroll", VerticalScroll).scroll_to(y=max(0, line - 2), animate=False)
