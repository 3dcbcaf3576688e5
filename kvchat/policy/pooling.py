"""1-D pooling of votes so that neighbours of an important token survive with it (SnapKV)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PoolMode = Literal["max", "avg"]


def pool_scores(scores: np.ndarray, kernel: int, mode: PoolMode) -> np.ndarray:
    """Pool along the last axis with an odd `kernel`, stride 1, output the same length.

    Like SnapKV's `max_pool1d` / `avg_pool1d(padding=kernel // 2)`: max ignores the padding,
    avg counts it as zeros.
    """
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pooling kernel must be odd and positive, got {kernel}")
    if kernel == 1 or scores.shape[-1] == 0:
        return scores.astype(np.float32, copy=True)
    half = kernel // 2
    pad_value = -np.inf if mode == "max" else 0.0
    pad_width = [(0, 0)] * (scores.ndim - 1) + [(half, half)]
    padded = np.pad(scores.astype(np.float32), pad_width, constant_values=pad_value)
    windows = sliding_window_view(padded, kernel, axis=-1)
    if mode == "max":
        return windows.max(axis=-1)
    if mode == "avg":
        return windows.mean(axis=-1)
    raise ValueError(f"unknown pooling mode {mode!r}; use 'max' or 'avg'")
