"""A prune plan: which positions survive; dropped positions merge into runs to remove."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def merge_runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Merge sorted, unique positions into half-open runs [p0, p1)."""
    if len(positions) == 0:
        return []
    positions = np.asarray(positions, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(positions)]))
    return [(int(positions[s]), int(positions[e - 1]) + 1) for s, e in zip(starts, ends)]


@dataclass(frozen=True)
class PrunePlan:
    """Kept positions (sorted) out of `n_tokens`. A per-head plan also says which positions each
    layer and KV head keeps: `head_kept` (n_layer, n_head_kv, cells), each row sorted and of the
    same length; `kept` is then their union."""

    n_tokens: int
    kept: np.ndarray
    head_kept: np.ndarray | None = None

    @classmethod
    def per_head(cls, n_tokens: int, head_kept: np.ndarray) -> "PrunePlan":
        return cls(n_tokens=n_tokens, kept=np.unique(head_kept), head_kept=head_kept)

    @classmethod
    def from_mask(cls, keep_mask: np.ndarray) -> "PrunePlan":
        return cls(n_tokens=len(keep_mask), kept=np.flatnonzero(keep_mask))
