"""Modal screens of the chat app: settings, key help, the file picker and the kept view."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DirectoryTree, Input, Label, Select, Static

from kvchat.documents import DOCUMENT_SUFFIXES
from kvchat.engine import AskSettings, above_most, choices, form_label, method_of, setting_names, user_settings, value_type
from kvchat.errors import SettingsError, printable
from kvchat.policy import SnapKV, method_options

SNAPKV_OPTIONS = {"kernel": SnapKV.kernel, "pool": SnapKV.pool}
MOST_TEMPERATURE = 5.0  # the chat's own bound: past it, answers are noise
ANSWER_FIELDS = {field.name for field in fields(AskSettings)} - {"method"}  # the settings an AskSettings holds as they are

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
        held = {**SNAPKV_OPTIONS, **self.settings.held_settings()}  # pooling shows SnapKV's under a method without it
        with Vertical(id="settings", classes="dialog"):
            yield Label("[b]Settings[/b]  (apply to the next answer)")
            with Grid(id="settings-grid"):
                for name in setting_names(in_form=True):
                    yield Label(form_label(name))
                    yield _setting_widget(name, held[name])
            yield Label("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _settings(self) -> AskSettings:
        shown = {name: self._value(name) for name in setting_names(in_form=True)}
        user = user_settings(shown)  # each value checked as the CLI and the server check it
        if user.temperature > MOST_TEMPERATURE:
            raise above_most("temperature", user.temperature, MOST_TEMPERATURE, "the most the chat samples with")
        # runs the method's checks (budget >= window + sinks …), with the pooling shown for every method: those it has
        shown_for_every_method = {"kernel": user.kernel, "pool": user.pool}
        method = method_of(user.model_copy(update=dict.fromkeys(shown_for_every_method)),
                           {**method_options(self.settings.method), **shown_for_every_method})
        answer = {name: getattr(user, name) for name in shown if name in ANSWER_FIELDS}
        return replace(self.settings, **answer, method=method, sampler=replace(self.settings.sampler, temperature=user.temperature))

    def _value(self, name: str) -> object:
        """The form's value of the setting `name`, as typed: the setting's own check refuses a wrong one."""
        if choices(name):
            return self.query_one(f"#{_widget_id(name)}", Select).value
        text = self.query_one(f"#{_widget_id(name)}", Input).value.strip()
        try:
            return value_type(name)(text)  # a number, as the CLI reads it
        except ValueError:
            return text

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        try:
            settings = self._settings()
        except (SettingsError, ValueError) as error:
            message = error.one_line(_named) if isinstance(error, SettingsError) else str(error)
            self.query_one("#settings-error", Label).update(Text(message, style="red"))  # the value as typed, not markup
            return
        self.dismiss(settings)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one("#save", Button).press()


def _named(setting: str) -> str:
    """How the form calls a setting an error names: its label."""
    return form_label(setting) if setting in setting_names(in_form=True) else setting


def _widget_id(name: str) -> str:
    return name.replace("_", "-")


def _setting_widget(name: str, value: object) -> Select | Input:
    """The form's field for a setting (UserSettings): a choice of its values, or a box for a number."""
    if kinds := choices(name):
        return Select([(kind, kind) for kind in kinds], value=value, allow_blank=False, compact=True, id=_widget_id(name))
    return Input(str(value), type="integer" if value_type(name) is int else "number", compact=True, id=_widget_id(name))


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
        # the document's control characters as ␛, ␇…: one for one, so the spans still point at their text
        self.text = printable(text, lines=True)
        self.spans, self.summary, self.focus, self.partial = spans, summary, focus, partial or []

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
