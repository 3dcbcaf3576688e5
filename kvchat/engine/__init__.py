"""The engine: conversations over one loaded model that turn documents and questions into events."""

from kvchat.engine.conversation import Conversation
from kvchat.engine.engine import Engine, state_store
from kvchat.engine.generate import Generation, answer_stats
from kvchat.engine.plan import ReadingPlan
from kvchat.engine.prepared import PreparedPrompt, answer_sources, prepare_chat, prepare_question
from kvchat.engine.prompt import Turn
from kvchat.engine.selections import SELECTIONS, Selection, selection_named, selections_help
from kvchat.engine.settings import DEFAULT_MAX_TOKENS, AskSettings, FastSettings, KvLayout
from kvchat.engine.stream import StreamSettings

__all__ = [
    "DEFAULT_MAX_TOKENS", "SELECTIONS", "AskSettings", "Conversation", "Engine", "FastSettings", "Generation", "KvLayout",
    "PreparedPrompt", "ReadingPlan", "Selection", "StreamSettings", "Turn", "answer_sources", "answer_stats", "prepare_chat",
    "prepare_question", "selection_named", "selections_help", "state_store",
]
