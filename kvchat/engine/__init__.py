"""The engine: conversations over one loaded model that turn documents and questions into events.

Here: the Engine (engine.py), the front door every front end asks through; a Conversation about a
document, its reading and its turns (conversation.py); the settings of an ask (settings.py); the chat
prompt (prompt.py); the installation's health (health.py). In its rooms:
  reading/     how a prompt comes into the KV cache: read whole, streamed, put together, or fast first
               (what the question's words or a cheap pass's attention choose)
  kvcache/     the KV cache of one context, its pruning, and its readings saved on disk
  selections/  what each answer of a conversation is chosen from
  answering/   the one route from a question to its answer (route.py): in parts or from kept
               entries, its sources, the reading after it; a prompt prepared for the server
"""

from kvchat.engine.conversation import Conversation
from kvchat.engine.drafts import paired_draft
from kvchat.engine.kvcache.in_progress import WAITING_FOR_TURN, InProgress, ReadingsInProgress, Survey, WholeReadingDone
from kvchat.engine.engine import Engine, part_store, readings_in_progress, state_store
from kvchat.engine.answering.generate import Generation, answer_stats
from kvchat.engine.reading.plan import ReadingPlan
from kvchat.engine.answering.elsewhere import PreparedPrompt
from kvchat.engine.health import installation, smoke_test
from kvchat.engine.prompt import SYSTEM_PROMPT, Turn
from kvchat.engine.reading.composed import ComposedReading
from kvchat.engine.reading.fast import speed_kind
from kvchat.engine.reading.fast_first import FastFirst
from kvchat.engine.reading.streamed import StreamedReading
from kvchat.engine.reading.way import Reading
from kvchat.engine.reading.whole import WholeReading
from kvchat.engine.selections import SELECTIONS, Selection, selection_named, selections_help
from kvchat.engine.settings import DEFAULT_MAX_TOKENS, WHOLES, AskSettings, FastSettings, KvLayout
from kvchat.engine.reading.stream import StreamSettings

__all__ = [
    "DEFAULT_MAX_TOKENS", "SYSTEM_PROMPT", "WAITING_FOR_TURN", "WHOLES", "SELECTIONS", "AskSettings", "ComposedReading", "Conversation",
    "Engine", "FastFirst", "FastSettings", "Generation", "InProgress", "KvLayout", "PreparedPrompt", "Reading", "ReadingPlan",
    "ReadingsInProgress", "Selection", "StreamSettings", "Survey",
    "StreamedReading", "Turn", "WholeReading", "WholeReadingDone", "answer_stats", "installation", "paired_draft", "part_store",
    "readings_in_progress", "selection_named", "selections_help", "smoke_test", "speed_kind", "state_store",
]
