"""Pure selection policy: numpy only, no llama.cpp. Methods, scoring, pooling and plans.

The engine feeds a method the votes the attention probe collected and applies the plan it returns.
"""

from kvchat.policy.full import Full
from kvchat.policy.method import DEFAULT_BUDGET, DEFAULT_SINKS, DEFAULT_WINDOW, MIN_BUDGET, Method, window_for
from kvchat.policy.plan import PrunePlan, merge_runs
from kvchat.policy.pooling import PoolMode, pool_scores
from kvchat.policy.registry import METHODS, method_carrying, method_named, method_options, methods_help
from kvchat.policy.scoring import HeadReduction, reduce_votes
from kvchat.policy.snapkv import SnapKV
from kvchat.policy.snapstream import SnapStream
from kvchat.policy.spans import SPAN_MODES, spans_from_pieces
from kvchat.policy.streaming_llm import StreamingLLM

__all__ = [
    "PoolMode",
    "DEFAULT_BUDGET",
    "DEFAULT_SINKS",
    "DEFAULT_WINDOW",
    "METHODS",
    "MIN_BUDGET",
    "SPAN_MODES",
    "Full",
    "HeadReduction",
    "Method",
    "PrunePlan",
    "SnapKV",
    "SnapStream",
    "StreamingLLM",
    "merge_runs",
    "method_carrying",
    "method_named",
    "method_options",
    "methods_help",
    "pool_scores",
    "reduce_votes",
    "spans_from_pieces",
    "window_for",
]
