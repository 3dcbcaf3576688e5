"""Pure selection policy: numpy only, no llama.cpp. Scoring, pooling, selection and plans.

The engine feeds it the votes the attention probe collected and applies the plan it returns.
"""

from kvchat.policy.plan import PrunePlan, merge_runs
from kvchat.policy.pooling import pool_scores
from kvchat.policy.scoring import HeadReduction, reduce_votes
from kvchat.policy.selection import SnapKV
from kvchat.policy.spans import spans_from_pieces

__all__ = [
    "HeadReduction",
    "PrunePlan",
    "SnapKV",
    "merge_runs",
    "pool_scores",
    "reduce_votes",
    "spans_from_pieces",
]
