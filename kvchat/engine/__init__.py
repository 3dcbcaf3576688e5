"""The engine: conversations over one loaded model that turn documents and questions into events."""

from kvchat.engine.conversation import Conversation
from kvchat.engine.engine import Engine, state_store
from kvchat.engine.plan import ReadingPlan
from kvchat.engine.selections import SELECTIONS, Selection, selection_named, selections_help
from kvchat.engine.settings import DEFAULT_MAX_TOKENS, AskSettings, KvLayout
from kvchat.engine.stream import StreamSettings

__all__ = [
    "DEFAULT_MAX_TOKENS", "SELECTIONS", "AskSettings", "Conversation", "Engine", "KvLayout", "ReadingPlan", "Selection", "StreamSettings",
    "selection_named", "selections_help", "state_store",
]
