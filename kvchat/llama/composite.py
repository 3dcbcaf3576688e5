"""Per-head kept sets in shared cells: a sequence state rewritten so that each layer and KV head
holds its own tokens (SnapKV's per-head selection, kept in llama.cpp's cells as KVCompose keeps
per-head choices in shared "composite" slots).

llama.cpp stores K already rotated by RoPE at its token's position, so a query scores a key by
their true distance whatever cell the key sits in: a cell's position only serves the causal mask
and later shifts (which rotate every head of the cell alike). So cell i may hold, in layer l and
KV head h, the K and V of any token that head chose, and B cells hold B tokens per head.

The state's layout: state.py's StateParts.
"""

from __future__ import annotations

import numpy as np

from kvchat.llama.state import HEADER, LAYOUT, STATE_MAGIC, StateParts

_CELL = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


def composite_state(state: bytes, sources: np.ndarray, positions: np.ndarray) -> bytes:
    """A one-sequence state of B cells from `state`: cell i holds, in layer l and KV head h, what
    the state's cell `sources[l, h, i]` held there. `sources` is (n_layer, n_head_kv, B) cell
    indices, `positions` the B new cells' positions (increasing). Raises ValueError for a state
    laid out otherwise (several streams, an M-RoPE cell table, a recurrent part); a quantized type
    whose blocks would straddle two heads never gets here (context.py refuses it)."""
    parts = StateParts(state)
    n_cells, (n_layer, n_head_kv, width) = parts.n_cells, sources.shape
    if width != len(positions) or (width and (sources.min() < 0 or sources.max() >= n_cells)):
        raise ValueError("the sources do not index the state's cells")
    if parts.n_layer != n_layer:
        raise ValueError(f"the state has {parts.n_layer} layers, the sources {n_layer}")
    cells = np.empty(width, dtype=_CELL)
    cells["pos"], cells["n_seq"], cells["seq"] = positions, 1, parts.seq
    out = [HEADER.pack(STATE_MAGIC, parts.seq, 1, width), cells.tobytes(), LAYOUT.pack(parts.v_trans, n_layer)]
    for layer, (header, data) in enumerate(zip(parts.layer_headers, parts.layers)):
        chosen = sources[layer % n_layer]
        if parts.v_trans and layer >= n_layer:
            # per dimension one element per cell; head h owns its dimensions h·head_dim_v onwards
            columns = data.reshape(n_head_kv, data.shape[0] // n_head_kv, n_cells, -1)
            gathered = columns[np.arange(n_head_kv)[:, None], :, chosen]  # (n_head_kv, B, head_dim, element)
            out += [header, gathered.transpose(0, 2, 1, 3).tobytes()]
        else:  # a row per cell: row i takes head h's bytes of row chosen[h, i]
            out += [header, data.reshape(n_cells, n_head_kv, -1)[chosen.T, np.arange(n_head_kv)].tobytes()]
    return b"".join(out)
