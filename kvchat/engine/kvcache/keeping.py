"""Which cells a prune keeps, and keeping them: KvCache's part that removes cells and compacts
the rest (the same cells in every head, or each head its own), its record kept true (cache.py)."""

from __future__ import annotations

import numpy as np

from kvchat.errors import KvchatError
from kvchat.engine.kvcache.pruning import plan_cells
from kvchat.events import Pruned
from kvchat.llama import LlamaContext
from kvchat.policy import Method, PrunePlan, merge_runs


class KeptCells:
    """KvCache's pruning; the record it writes is KvCache's (declared here for its methods)."""

    ctx: LlamaContext
    positions: np.ndarray
    tokens: np.ndarray
    origins: np.ndarray
    head_origins: np.ndarray | None
    cells: int

    def plan(
        self, method: Method, window: int, votes: np.ndarray | None, pinned: tuple[int, int] | None = None,
        first: np.ndarray | None = None,
    ) -> PrunePlan:
        """Which cells `method` keeps (pruning.py); the last `window` cells observed and cast `votes`."""
        n_cells = self.cells if votes is None else votes.shape[-1]
        return plan_cells(self.ctx.model, self.tokens, n_cells, method, window, votes, pinned, first)

    def apply(self, plan: PrunePlan) -> np.ndarray:
        """Keep what `plan` (made by plan()) keeps: the same cells in every head, or each head its
        own. Returns the positions no head keeps."""
        if plan.head_kept is None:
            return self.keep_cells(plan.kept)
        return self.keep_per_head(plan.head_kept)

    def keep_per_head(self, head_cells: np.ndarray) -> np.ndarray:
        """Keep for each layer and KV head its own cells, `head_cells` (n_layer, n_head_kv, B),
        each row sorted: afterwards cell i holds, in layer l and KV head h, what cell
        head_cells[l, h, i] held there, and the position of the latest cell any head took for it
        (so the positions still increase, and the pinned window keeps its own). The cells no head
        keeps go first, so the state rewritten is no larger than needed. Returns their positions.

        A later shift (the ring's repack) moves a cell's heads alike, from the cell's position."""
        union = np.unique(head_cells)
        mask = np.zeros(self.cells, dtype=bool)
        mask[union] = True
        dropped = self.positions[~mask]
        self.ctx.remove_runs(0, merge_runs(dropped))
        latest = head_cells.max(axis=(0, 1))
        sources = np.searchsorted(union, head_cells)  # the state lists the union's cells in order
        written = self.ctx.compact_per_head(0, sources, self.positions[latest])
        held = self.held_origins(*head_cells.shape[:2])
        self.head_origins = np.take_along_axis(held, head_cells, axis=-1)
        self.positions, self.tokens, self.origins = self.positions[latest], self.tokens[latest], self.origins[latest]
        self.verify(written)
        return dropped

    def held_origins(self, n_layer: int, n_head_kv: int) -> np.ndarray:
        """(n_layer, n_head_kv, cells): the prompt index of the token each head holds in each cell."""
        if self.head_origins is not None:
            return self.head_origins
        return np.broadcast_to(self.origins, (n_layer, n_head_kv, self.cells))

    def kept_origins(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The prompt indices of the tokens the cells hold, sorted, and for a cache kept per head
        how many (layer, KV head) pairs hold each (None: every head holds every one)."""
        if self.head_origins is None:
            return np.sort(self.origins), None
        return np.unique(self.head_origins, return_counts=True)

    def pruned(self, n_prompt: int, observe_s: float, compact_s: float) -> Pruned:
        """The event saying what a selection from `n_prompt` tokens kept."""
        kept, heads = self.kept_origins()
        if heads is None:
            return Pruned(n_prompt, self.cells, tuple(int(p) for p in kept), observe_s, compact_s)
        return Pruned(n_prompt, self.cells, tuple(int(p) for p in kept), observe_s, compact_s,
                      kept_heads=tuple(int(n) for n in heads), head_count=int(np.prod(self.head_origins.shape[:2])))

    def keep_cells(self, kept_cells: np.ndarray) -> np.ndarray:
        """Remove every cell not in `kept_cells` (sorted cell indices), compact, verify.

        Returns the positions removed.
        """
        mask = np.zeros(self.cells, dtype=bool)
        mask[kept_cells] = True
        dropped = self.positions[~mask]
        self.ctx.remove_runs(0, merge_runs(dropped))
        written = self.ctx.compact(0)
        self.positions, self.tokens, self.origins = self.positions[mask], self.tokens[mask], self.origins[mask]
        if self.head_origins is not None:
            self.head_origins = self.head_origins[..., mask]
        self.verify(written)
        return dropped

    def verify(self, actual: np.ndarray | None = None) -> None:
        """The cache holds exactly the recorded positions, densely from cell 0, in order
        (`actual`: the positions just written back by a compaction, else read from llama.cpp)."""
        actual = self.ctx.positions(0) if actual is None else actual
        if not np.array_equal(actual, self.positions):
            raise KvchatError(
                f"KV cache check failed: {len(actual)} cells, {self.cells} expected",
                "please report this with the log file",
            )
