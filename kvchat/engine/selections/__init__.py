"""Selections: when a conversation's answers choose their kept cells, and from what."""

from kvchat.engine.selections.document import PerDocument
from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.registry import SELECTIONS, selection_named
from kvchat.engine.selections.reuse import Reuse
from kvchat.engine.selections.selection import QuestionStart, Selection

__all__ = ["SELECTIONS", "PerDocument", "PerQuestion", "QuestionStart", "Reuse", "Selection", "selection_named"]
