"""The chat app's dialogs, one at a time: the file picker (open a document, or add one to those
open), the settings, the kept view (also at an answer's source) and the keys. The base class of KvchatApp (app.py), which
holds the state they read and starts the reading they ask for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from textual.app import App
from textual.screen import ModalScreen

from kvchat.documents import Document
from kvchat.documents.bundle import kept_by_source
from kvchat.engine import AskSettings
from kvchat.errors import printable
from kvchat.events import Pruned, Source
from kvchat.tui.messages import Job
from kvchat.tui.screens import HelpScreen, KeptScreen, PickerScreen, SettingsScreen
from kvchat.tui.sessions import ChatSession
from kvchat.tui.widgets import KvPanel


class Dialogs(App[None]):
    """The dialog actions of the chat app (ctrl+o, ctrl+a, ctrl+s, ctrl+t, F1)."""

    settings: AskSettings
    session: ChatSession | None
    busy: Job | None
    paths: list[Path]
    start_dir: Path
    _kept: tuple[tuple[int, ...], int] | None
    open_paths: Callable[[Sequence[Path]], None]  # the app's: close what is open, read these

    def _dialog_open(self, kind: type[ModalScreen] | None = None) -> bool:
        """One dialog at a time: while one is open the keys that open dialogs do nothing,
        except that the key of the open dialog closes it (F1 toggles the keys, ctrl+s settings)."""
        top = self.screen
        if not isinstance(top, ModalScreen):
            return False
        if kind is not None and isinstance(top, kind):
            top.dismiss(None)
        return True

    def action_open_document(self) -> None:
        self._pick(adding=False)

    def action_add_document(self) -> None:
        """Ask about one more document together with those open, in a new conversation; with
        none open, open one."""
        self._pick(adding=bool(self.paths))

    def _pick(self, adding: bool) -> None:
        if self._dialog_open(PickerScreen):
            return
        if self.busy is not None:
            self.notify("busy: esc stops it first", severity="warning")
            return
        self.push_screen(PickerScreen(self.start_dir), lambda path: self._picked(path, adding))

    def _picked(self, path: Path | None, adding: bool) -> None:
        if path is not None:
            self.start_dir = path.parent
            self.open_paths([*self.paths, path] if adding else [path])
        elif self.session is None:
            self.notify("no document open: ctrl+o opens one, ctrl+q quits")

    def action_settings(self) -> None:
        if self._dialog_open(SettingsScreen):
            return
        self.push_screen(SettingsScreen(self.settings), self._new_settings)

    def _new_settings(self, settings: AskSettings | None) -> None:
        if settings is None:
            return
        reread = settings.method.streams != self.settings.method.streams and self.session is not None
        self.settings = settings
        panel = self.query_one(KvPanel)
        panel.settings = settings
        panel.refresh_figures()
        if reread and self.busy is None:
            self.open_paths(self.paths)
        self.notify("settings saved" + ("; reading the document again" if reread else ""))

    def action_kept(self) -> None:
        if self._dialog_open(KeptScreen):
            return
        if self.session is None or self._kept is None:
            self.notify("nothing pruned yet: the kept view shows what the last answer's selection kept")
            return
        self._show_document(self._kept)

    def show_source(self, source: Source, document: Document, kept: Pruned | None) -> None:
        """The kept view at one of an answer's sources, with what that answer's selection kept
        (the whole document when nothing was pruned)."""
        if self.session is None or self._dialog_open():
            return
        if document is not self.session.document:
            self.notify("that answer was about another document: open it again to see its sources", severity="warning")
            return
        self._show_document(kept, (source.start, source.end))

    def _show_document(self, kept: Pruned | None, focus: tuple[int, int] | None = None) -> None:
        assert self.session is not None
        spans: list[tuple[int, int]] = []
        partial: list[tuple[int, int]] = []
        summary = "nothing was pruned: the answer saw the whole document"
        if kept is not None and kept.kept_heads:  # kept per head: by every head, or by some
            every = [p for p, heads in zip(kept.kept_positions, kept.kept_heads) if heads == kept.head_count]
            some = [p for p, heads in zip(kept.kept_positions, kept.kept_heads) if heads < kept.head_count]
            spans, partial = self.session.kept_spans(every), self.session.kept_spans(some)
            summary = (f"{kept.kept_tokens:,} of {kept.prompt_tokens:,} prompt tokens kept by each of {kept.head_count} "
                       f"layer and KV heads; highlighted: kept by every head ({len(every):,} tokens), "
                       f"yellow: by some of them ({len(some):,})")
        elif kept is not None:
            spans = self.session.kept_spans(kept.kept_positions)
            summary = f"{kept.kept_tokens:,} of {kept.prompt_tokens:,} prompt tokens kept; the highlighted text is what the answer saw"
        kept_any = spans if not partial else self.session.kept_spans(kept.kept_positions if kept else ())
        if per_document := kept_by_source(self.session.document, kept_any):
            summary += " · " + " · ".join(f"{printable(name)}: {chars:,} chars" for name, chars in per_document.items())
        self.push_screen(KeptScreen(self.session.document.text.strip(), spans, summary, focus, partial))

    def action_help(self) -> None:
        if self._dialog_open(HelpScreen):
            return
        self.push_screen(HelpScreen())
