"""What an answer attended to: its tokens decoded once more over the prompt's kept cells with the
attention probe on (one batch, like the question's observation window, so the streamed answer is
not slowed), each prompt token scored by the attention it drew. text/sources.py tells passages by it.
"""

from __future__ import annotations

import numpy as np

from kvchat.engine.kvcache.cache import KvCache

Attention = tuple[np.ndarray, np.ndarray]  # the prompt tokens the cells hold, and the attention each drew


def answer_scores(votes: np.ndarray, origins: np.ndarray, head_origins: np.ndarray | None = None) -> Attention:
    """(tokens, scores): the prompt tokens the cells hold (their indices in the prompt) and each
    one's score from the answer's votes (n_layer, n_head, cells), summed over heads and the upper
    half of the layers, which found the experts' clause most often
    (docs/bench/design-history.md, "Sources from the answer's attention").
    In a cache kept per head, a cell holds a token per layer and KV head
    (`head_origins`, (n_layer, n_head_kv, cells)), and each head's attention goes to its own."""
    upper = votes[votes.shape[0] // 2 :]
    n_cells = upper.shape[-1]
    if head_origins is None:
        return origins[:n_cells], upper.sum(axis=(0, 1), dtype=np.float64)
    held = head_origins[votes.shape[0] // 2 : votes.shape[0], :, :n_cells]
    per_kv_head = upper.reshape(len(upper), held.shape[1], -1, n_cells).sum(axis=2, dtype=np.float64)
    tokens, index = np.unique(held, return_inverse=True)
    return tokens, np.bincount(index.ravel(), weights=per_kv_head.ravel(), minlength=len(tokens))


def answer_attention(cache: KvCache, n_prompt_cells: int, decoded_elsewhere: list[int] | None = None) -> Attention | None:
    """What the answer in `cache`'s cells after the first `n_prompt_cells` (the kept prompt)
    attended to: (origins, scores) of the prompt's cells (their tokens' indices in the prompt),
    each score the attention it drew from the answer's tokens (at most a batch of them: the
    first), as answer_scores sums it. None when no answer token is in the cache, or the ring
    evicted some (the rest then do not follow the prompt's positions).

    `decoded_elsewhere`: the answer's tokens, decoded on another context (the server's batch)
    while `cache` holds the kept prompt alone; they are read after it with the probe on."""
    if decoded_elsewhere is not None:
        if not decoded_elsewhere or cache.cells != n_prompt_cells:
            return None
        votes = cache.observe(decoded_elsewhere[: cache.ctx.settings.n_batch])[..., :n_prompt_cells]
        return answer_scores(votes, cache.origins.copy(), cache.head_origins)
    answer = cache.positions[n_prompt_cells:]
    if not len(answer) or not n_prompt_cells:
        return None
    last_prompt = cache.positions[n_prompt_cells - 1]
    if not np.array_equal(answer, np.arange(last_prompt + 1, last_prompt + 1 + len(answer))):
        return None
    votes = cache.reobserve(n_prompt_cells, min(len(answer), cache.ctx.settings.n_batch))
    return answer_scores(votes, cache.origins.copy(), cache.head_origins)
