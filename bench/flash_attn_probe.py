"""The two attention probes on the same prompt: flash attention off (softmax read through the
eval callback) vs on (recomputed from queries and keys). Prints vote correlation, kept-set
overlap, reading time and scoring time.

    python bench/flash_attn_probe.py --lengths 1500,4000 --budgets 256,1024
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kvchat.bench.tasks import needle_case
from kvchat.engine.cache import KvCache
from kvchat.engine.pipeline import plan_cells
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.models import resolve_model
from kvchat.policy import SnapKV

WINDOW = 32


def measure(
    model: LlamaModel, tokens: list[int], flash_attn: bool, policies: list[SnapKV]
) -> tuple[np.ndarray, list[np.ndarray], float, float]:
    """Votes, the kept cells for each policy, reading and scoring seconds."""
    cache = KvCache(LlamaContext(model, ContextSettings(n_ctx=len(tokens) + 256, flash_attn=flash_attn)))
    try:
        started = time.perf_counter()
        cache.decode(tokens[:-WINDOW])
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        votes = cache.observe(tokens[-WINDOW:])
        observe_s = time.perf_counter() - started
        return votes, [plan_cells(model, policy, votes, cache).kept for policy in policies], read_s, observe_s
    finally:
        cache.ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1500,4000")
    parser.add_argument("--budgets", default="256,1024")
    args = parser.parse_args()
    policies = [SnapKV(budget=int(budget), window=WINDOW) for budget in args.budgets.split(",")]
    with LlamaModel(resolve_model("default")) as model:
        for length in (int(n) for n in args.lengths.split(",")):
            case = needle_case(lambda text: len(model.tokenize(text)), length, 0.5, seed=7)
            prompt = model.apply_chat_template([{"role": "user", "content": f"{case.document}\n\n{case.question}"}])
            tokens = model.tokenize(prompt)
            (off, kept_off, read_off, obs_off), (on, kept_on, read_on, obs_on) = (
                measure(model, tokens, flash_attn, policies) for flash_attn in (False, True)
            )
            print(json.dumps({
                "tokens": len(tokens),
                "vote_correlation": round(float(np.corrcoef(off.ravel(), on.ravel())[0, 1]), 5),
                "kept_overlap": {
                    policy.budget: round(len(np.intersect1d(a, b)) / len(a), 4)
                    for policy, a, b in zip(policies, kept_off, kept_on)
                },
                "read_s": {"off": round(read_off, 2), "on": round(read_on, 2)},
                "observe_s": {"off": round(obs_off, 3), "on": round(obs_on, 3)},
            }))


if __name__ == "__main__":
    main()
