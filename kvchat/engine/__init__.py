"""The engine: conversations over one loaded model that turn documents and questions into events.

Here: the Engine (engine.py), the front door every front end asks through; a Conversation about a
document, its reading and its turns (conversation.py); the settings a user chooses
(user_settings.py) and those of an ask (settings.py); the chat prompt (prompt.py); the
installation's health (health.py). In its rooms:
  reading/     how a prompt comes into the KV cache: its ways of reading (ways/: whole, streamed,
               or fast first), reading in chunks within the budget (chunked.py) and the fast
               reading's choice (reading/fast_reading.py: what the question's words or a cheap pass choose)
  kvcache/     the KV cache of one context, its pruning, and its readings saved on disk
  selections/  what each answer of a conversation is chosen from
  answering/   the one route from a question to its answer (route.py): in parts or from kept
               entries, its sources, the reading after it; a prompt prepared for the server
"""

from kvchat.engine.conversation import Conversation
from kvchat.engine.drafts import NO_DRAFT, draft_at_start, draft_for, paired_draft
from kvchat.engine.health import time_read_and_decode
from kvchat.engine.kvcache.foreground import PAUSED_CHECK_S, HeldWhileBusy, batches_stop_while
from kvchat.engine.kvcache.in_progress import WAITING_FOR_TURN, InProgress, ReadingsInProgress, Survey, WholeReadingDone
from kvchat.engine.engine import Engine, part_store, readings_in_progress, state_store
from kvchat.engine.reading.generate import Generation, answer_stats
from kvchat.engine.reading.passage_bank import PassageBank
from kvchat.engine.reading.plan import ReadingPlan
from kvchat.engine.answering.elsewhere import PreparedPrompt
from kvchat.engine.answering.whole_question import about_whole
from kvchat.engine.health import installation, smoke_test
from kvchat.engine.prompt import SYSTEM_PROMPT, Turn
from kvchat.engine.reading.cheap_pass import speed_kind
from kvchat.engine.selections import SELECTIONS, Selection, selection_named
from kvchat.engine.settings import AskSettings, FastSettings, KvLayout, StreamSettings, ask_settings, method_of
from kvchat.engine.user_settings import (
    ADVANCED, ANSWER, DEFAULT_MAX_TOKENS, MOST_TOKENS, UserSettings, above_most, choices, form_label, invalid_setting, panel,
    setting_names, user_settings, value_type,
)

__all__ = [
    "ADVANCED", "ANSWER", "DEFAULT_MAX_TOKENS", "MOST_TOKENS", "NO_DRAFT", "PAUSED_CHECK_S", "SELECTIONS", "SYSTEM_PROMPT",
    "WAITING_FOR_TURN", "AskSettings", "Conversation", "Engine", "FastSettings", "Generation", "HeldWhileBusy", "InProgress",
    "KvLayout", "PassageBank", "PreparedPrompt", "ReadingPlan", "ReadingsInProgress", "Selection", "StreamSettings", "Survey",
    "Turn", "UserSettings", "WholeReadingDone", "about_whole", "above_most", "answer_stats", "ask_settings",
    "batches_stop_while", "choices", "draft_at_start", "draft_for", "form_label", "installation", "invalid_setting",
    "method_of", "paired_draft", "panel", "part_store", "readings_in_progress", "selection_named", "setting_names",
    "smoke_test", "speed_kind", "state_store", "time_read_and_decode", "user_settings", "value_type",
]
