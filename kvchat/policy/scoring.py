"""Reduce per-head votes to one score per position.

llama.cpp's KV cells are shared by every head of a layer and pruning removes a cell from all
layers at once, so SnapKV's per-head selection has to become one ranking of positions:

- `sum` (the default): plain sum over layers and heads.
- `normalized`: each head's votes over the candidate positions are scaled to sum to one before
  summing, so every head gets one equal vote.
- `topk-count`: each head picks its own top-k; a position scores the number of heads that picked
  it (ties broken by the normalized sum).
- `max`: a position scores the most any one head of any layer gave it (Speculative Prefill's
  reduction, Liu et al. 2025), so that a few heads that find the answer outvote many broad ones.
- `per-head` is no reduction: each layer and KV head keeps its own tokens, and the cache is
  rewritten so that the shared cells hold them (SnapKV as the paper does it; snapkv.py and
  llama/composite.py).

`sum` is the default: no other reduction answered more, and `per-head` garbled a title copied word
for word (measured in docs/bench/design-history.md, "One ranking for every head").
"""

from __future__ import annotations

from enum import Enum

import numpy as np


class HeadReduction(str, Enum):
    SUM = "sum"
    NORMALIZED = "normalized"
    TOPK_COUNT = "topk-count"
    MAX = "max"
    PER_HEAD = "per-head"


def _normalized(votes: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    masked = np.where(candidates, votes, 0.0)
    totals = masked.sum(axis=-1, keepdims=True)
    return masked / np.maximum(totals, 1e-12)


def _topk_count(votes: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    n_candidates = int(candidates.sum())
    normalized_sum = _normalized(votes, candidates).reshape(-1, votes.shape[-1]).sum(axis=0)
    if k >= n_candidates:
        return normalized_sum
    per_head = np.where(candidates, votes, -np.inf).reshape(-1, votes.shape[-1])
    top = np.argpartition(-per_head, k - 1, axis=-1)[:, :k]
    counts = np.bincount(top.ravel(), minlength=votes.shape[-1]).astype(np.float64)
    tie_break = normalized_sum / max(float(normalized_sum.max()), 1e-12) * 0.5
    return counts + tie_break


def reduce_votes(
    votes: np.ndarray, candidates: np.ndarray, reduction: HeadReduction, k: int
) -> np.ndarray:
    """Scores (n_positions,) from votes (n_layers, n_heads, n_positions).

    `candidates` marks the positions competing for the budget (pinned ones are excluded);
    `k` is how many of them will be kept. Non-candidates score -inf.
    """
    reduction = HeadReduction(reduction)
    if reduction is HeadReduction.PER_HEAD:
        raise ValueError("per-head selection keeps each head's own tokens: there is nothing to reduce")
    if reduction is HeadReduction.SUM:
        scores = votes.reshape(-1, votes.shape[-1]).sum(axis=0, dtype=np.float64)
    elif reduction is HeadReduction.MAX:
        scores = votes.reshape(-1, votes.shape[-1]).max(axis=0).astype(np.float64)
    elif reduction is HeadReduction.NORMALIZED:
        scores = _normalized(votes, candidates).reshape(-1, votes.shape[-1]).sum(axis=0)
    else:
        scores = _topk_count(votes, candidates, k)
    return np.where(candidates, scores, -np.inf)
