"""1-D pooling of votes so that neighbours of an important token survive with it (SnapKV)."""

from __future__ import annotations

from typing import Literal

import numpy as np

PoolMode = Literal["max", "avg"]


def pool_scores(scores: np.ndarray, kernel: int, mode: PoolMode) -> np.ndarray:
    """Pool along the last axis with an odd `kernel`, stride 1, output the same length.

    Like SnapKV's `max_pool1d` / `avg_pool1d(padding=kernel // 2)`: max ignores the padding,
    avg counts it as zeros. Computed in place as shifted element-wise maxima/sums (no padded
    copy), far faster than a sliding-window reduction on (layers, heads, 16K) votes.
    """
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pooling kernel must be odd and positive, got {kernel}")
    if mode not in ("max", "avg"):
        raise ValueError(f"unknown pooling mode {mode!r}; use 'max' or 'avg'")
    scores = scores.astype(np.float32, copy=False)
    pooled = scores.copy()
    if kernel == 1 or scores.shape[-1] == 0:
        return pooled
    combine = np.maximum if mode == "max" else np.add
    for offset in range(1, min(kernel // 2, scores.shape[-1] - 1) + 1):
        combine(pooled[..., offset:], scores[..., :-offset], out=pooled[..., offset:])
        combine(pooled[..., :-offset], scores[..., offset:], out=pooled[..., :-offset])
    return pooled if mode == "max" else pooled / kernel
