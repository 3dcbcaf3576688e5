"""Every selection by name: what `ask --select`, the bench and the TUI offer and build."""

from __future__ import annotations

from kvchat.engine.selections.document import PerDocument
from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.reuse import Reuse
from kvchat.engine.selections.selection import Selection
from kvchat.errors import SettingsError

SELECTIONS: dict[str, type[Selection]] = {selection.name: selection for selection in (PerQuestion, PerDocument, Reuse)}


def selection_named(name: str) -> Selection:
    selection = SELECTIONS.get(name)
    if selection is None:
        raise SettingsError(f"unknown selection {name!r}", f"use one of: {', '.join(SELECTIONS)}")
    return selection()
