"""Attention scores with flash attention on: recomputed from the window's queries and the keys.

The fused flash-attention kernel never materialises softmax(QKᵀ), so `kq_soft_max-<il>` does
not exist. Instead the probe keeps each layer's post-RoPE queries (`Qcur-<il>`, shape (ne)
[head_dim, n_head, n_tokens]) of the observed window, and once the decode is done it reads every
cell's keys from the sequence state and recomputes softmax(q·k / √head_dim) per head, with the
model's GQA grouping (query head h reads KV head h // (n_head / n_head_kv)) and the causal mask.
The votes are the same sums over the window's rows as AttentionProbe's. Models whose attention
scale is not 1/√head_dim (soft-capping, a custom query scale) are scored approximately.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from kvchat.errors import KvchatError
from kvchat.llama._lib import GGML_TYPE_F32, GgmlTensorHead
from kvchat.llama.graph_nodes import NodeWatcher
from kvchat.llama.state import cell_keys, cell_positions

class QueryProbe(NodeWatcher):
    """Collects the window's queries; stop() turns them into votes (n_layer, n_head, n_cells)."""

    node_prefix = b"Qcur-"

    def __init__(self, n_layer: int, n_head: int, n_head_kv: int, head_dim: int) -> None:
        super().__init__()
        self.n_layer, self.n_head, self.n_head_kv, self.head_dim = n_layer, n_head, n_head_kv, head_dim
        self.state_source: Callable[[], bytes] | None = None  # the sequence's state, set by the context
        self._n_cells = 0
        self._queries: dict[int, np.ndarray] = {}

    def start(self, n_cells: int) -> None:
        self._active, self._n_cells, self._queries, self._error = True, n_cells, {}, None

    def abort(self) -> None:
        self._active, self._queries = False, {}

    def stop(self) -> np.ndarray:
        self._raise_kept()
        missing = [il for il in range(self.layer_count) if il not in self._queries]
        if missing or self.state_source is None:
            raise KvchatError(f"the query probe saw no queries for layers {missing[:4]}", "use `flash_attn` off")
        state = self.state_source()
        keys = cell_keys(state, self.n_layer, self.head_dim)[:, : self._n_cells]
        positions = cell_positions(state)[: self._n_cells]
        votes = [self._layer_votes(self._queries[il], keys[il], positions) for il in range(self.layer_count)]
        self._queries = {}
        return np.stack(votes)

    def _layer_votes(self, queries: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """queries (window, n_head, head_dim), keys (cells, n_head_kv * head_dim) -> (n_head, cells)."""
        window = queries.shape[0]
        group = self.n_head // self.n_head_kv
        keys = keys.reshape(len(positions), self.n_head_kv, self.head_dim)
        query_positions = positions[-window:]
        hidden = positions[None, :] > query_positions[:, None]  # causal mask, (window, cells)
        votes = np.empty((self.n_head, len(positions)), dtype=np.float32)
        scale = 1.0 / np.sqrt(self.head_dim)
        for head in range(self.n_head):
            logits = (queries[:, head, :] @ keys[:, head // group, :].T) * scale
            logits[hidden] = -np.inf
            logits -= logits.max(axis=1, keepdims=True)
            weights = np.exp(logits)
            weights /= weights.sum(axis=1, keepdims=True)
            votes[head] = weights.sum(axis=0)
        return votes

    def _collect(self, tensor: int, layer: int) -> None:
        head = GgmlTensorHead.from_address(tensor)
        if head.type != GGML_TYPE_F32:
            raise KvchatError(f"Qcur-{layer} is not f32 (type {head.type})", "use `flash_attn` off")
        head_dim, n_head, n_tokens = (int(n) for n in head.ne[:3])
        if (head_dim, n_head) != (self.head_dim, self.n_head) or not self._lib.ggml_is_contiguous(tensor):
            return  # the projection before it is reshaped into heads
        values = np.empty(head_dim * n_head * n_tokens, dtype=np.float32)
        self._lib.ggml_backend_tensor_get(tensor, values.ctypes.data_as(ctypes.c_void_p), 0, values.nbytes)
        # Several nodes are named Qcur-<il> (projection, heads, after RoPE); the last one of the
        # layer, in graph order, is the rotated query. The window is decoded in one micro-batch.
        self._queries[layer] = values.reshape(n_tokens, n_head, head_dim)
