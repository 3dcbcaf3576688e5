"""The attention probe: reads the model's softmaxed attention through llama.cpp's eval callback.

With flash attention off, layer `il`'s attention probabilities are the graph node
`kq_soft_max-<il>`, shape (ne) [n_kv, n_tokens, n_head, n_stream], columns = KV cells. While
active, the probe asks the scheduler for exactly those nodes and reduces each one at once to
votes (sum over the window's query rows), so memory stays O(layers x heads x cells).
While inactive it answers False to every node straight away.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kvchat.errors import KvchatError
from kvchat.llama._lib import GGML_TYPE_F32, GgmlTensorHead
from kvchat.llama.graph_nodes import NodeWatcher

class AttentionProbe(NodeWatcher):
    """Collects votes (n_layer, n_head, n_cells) for one observation window at a time."""

    node_prefix = b"kq_soft_max-"

    def __init__(self, n_layer: int) -> None:
        super().__init__()
        self.n_layer = n_layer
        self._n_cells = 0
        self._votes: np.ndarray | None = None  # (n_layer, n_head, n_cells), filled layer by layer
        self._seen: set[int] = set()

    def start(self, n_cells: int) -> None:
        """Observe the next decode; cells [0, n_cells) are the valid ones (a hole-free cache)."""
        self._active = True
        self._n_cells = n_cells
        self._votes = None
        self._seen = set()
        self._error = None

    def stop(self) -> np.ndarray:
        """Stop observing; the votes of every layer computed, shape (layer_count, n_head, n_cells)."""
        self._raise_kept()
        missing = [il for il in range(self.layer_count) if il not in self._seen]
        if missing or self._votes is None:
            raise KvchatError(
                f"the attention probe saw no attention for layers {missing[:4]}",
                "attention scores need flash attention off and ordinary attention layers",
            )
        votes, self._votes = self._votes, None
        return votes[: self.layer_count]

    def abort(self) -> None:
        """Stop observing after a failed decode; the partial votes are dropped."""
        self._active = False
        self._votes = None

    def _collect(self, tensor: int, layer: int) -> None:
        head = GgmlTensorHead.from_address(tensor)
        if head.type != GGML_TYPE_F32:
            raise KvchatError(f"kq_soft_max-{layer} is not f32 (type {head.type})", "use flash attention off")
        n_kv, n_tokens, n_head, n_stream = (int(n) for n in head.ne)
        rows = self._probabilities(tensor, head).reshape(n_stream, n_head, n_tokens, n_kv)[0, :, :, : self._n_cells]
        if self._votes is None:
            self._votes = np.zeros((self.n_layer, n_head, self._n_cells), dtype=np.float32)
        votes = self._votes[layer]
        if layer in self._seen:  # the window was split over several micro-batches
            votes += rows.sum(axis=1)
        else:
            rows.sum(axis=1, out=votes)
        self._seen.add(layer)

    def _probabilities(self, tensor: int, head: GgmlTensorHead) -> np.ndarray:
        """The tensor's floats: read in place from host memory (CPU), else copied out."""
        count = self._lib.ggml_nbytes(tensor) // 4
        if head.buffer and self._lib.ggml_backend_buffer_is_host(head.buffer) and self._lib.ggml_is_contiguous(tensor):
            address = self._lib.ggml_get_data(tensor)
            return np.ctypeslib.as_array((ctypes.c_float * count).from_address(address))
        probabilities = np.empty(count, dtype=np.float32)
        self._lib.ggml_backend_tensor_get(tensor, probabilities.ctypes.data_as(ctypes.c_void_p), 0, count * 4)
        return probabilities
