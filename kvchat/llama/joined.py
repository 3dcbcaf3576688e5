"""Several saved runs of cells as one sequence state: a passage bank's chosen passages, each saved
alone (state_from), loaded into a context at once (llama_state_seq_set_data empties the sequence
it restores, so pieces cannot be loaded one after another).

Each piece is a one-stream, one-sequence state of the same KV layout (state.py, composite.py).
The joined state holds their cells in the order given, with their positions: the caller gives
pieces whose positions increase across them. K keeps the rotation of each cell's own position;
a shift (llama_memory_seq_add) after loading moves the cells to the positions they are read at.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvchat.llama.state import HEADER, LAYOUT, STATE_MAGIC, StateBuffer, StateParts



def joined_state(pieces: Sequence[StateBuffer]) -> bytes:
    """One sequence state holding every piece's cells, in order. ValueError for pieces laid out
    otherwise than each other or than one stream of one sequence."""
    if not pieces:
        raise ValueError("nothing to join")
    parsed = [StateParts(piece) for piece in pieces]
    first = parsed[0]
    if any(piece.layout != first.layout for piece in parsed):
        raise ValueError("the pieces have different KV layouts")
    n_cells = sum(piece.n_cells for piece in parsed)
    out = [HEADER.pack(STATE_MAGIC, first.seq, 1, n_cells), *(piece.cell_bytes for piece in parsed),
           LAYOUT.pack(first.v_trans, first.n_layer)]
    for layer in range(2 * first.n_layer):  # K's layers, then V's
        out.append(first.layer_headers[layer])
        if first.v_trans and layer >= first.n_layer:  # per dimension, one element per cell: the pieces side by side
            out.append(np.concatenate([piece.layers[layer] for piece in parsed], axis=1).tobytes())
        else:
            out.extend(piece.layers[layer].tobytes() for piece in parsed)
    return b"".join(out)


def state_from(state: StateBuffer, first_cell: int, end_cell: int | None = None) -> bytes:
    """The state of the cells [first_cell, end_cell) (to the last when None): a passage read after
    the prompt's opening, or the part of it before a question's window."""
    piece = StateParts(state)
    end = piece.n_cells if end_cell is None else min(end_cell, piece.n_cells)
    offsets = piece.cell_offsets
    out = [HEADER.pack(STATE_MAGIC, piece.seq, 1, end - first_cell), piece.cell_bytes[offsets[first_cell] : offsets[end]],
           LAYOUT.pack(piece.v_trans, piece.n_layer)]
    for layer, (header, data) in enumerate(zip(piece.layer_headers, piece.layers)):
        out.append(header)
        if piece.v_trans and layer >= piece.n_layer:
            element_bytes = data.shape[1] // max(piece.n_cells, 1)
            out.append(data[:, first_cell * element_bytes : end * element_bytes].tobytes())
        else:
            out.append(data[first_cell:end].tobytes())
    return b"".join(out)
