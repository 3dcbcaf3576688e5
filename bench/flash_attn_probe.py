"""The two attention probes on the same prompt. Three readings of one needle prompt: flash
attention off with the softmax read through the eval callback ("softmax"), flash attention off
with the scores recomputed from queries and keys ("queries": the probe's own error, same
arithmetic), and flash attention on with the query probe ("flash": what a user gets, flash
attention's arithmetic included). Prints vote correlation and kept-set overlap of each against
"softmax", reading and scoring seconds.

    python bench/flash_attn_probe.py --lengths 1500,4000 --budgets 256,1024 [--flash-type-k q8_0]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from kvchat.bench.tasks import needle_case
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.models import resolve_model
from kvchat.policy import SnapKV

WINDOW = 32


@dataclass
class Reading:
    votes: np.ndarray
    kept: list[np.ndarray]  # per policy
    read_s: float
    observe_s: float


def measure(model: LlamaModel, tokens: list[int], policies: list[SnapKV], **context: object) -> Reading:
    cache = KvCache(LlamaContext(model, ContextSettings(n_ctx=len(tokens) + 256, **context)))  # type: ignore[arg-type]
    try:
        started = time.perf_counter()
        cache.decode(tokens[:-WINDOW])
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        votes = cache.observe(tokens[-WINDOW:])
        observe_s = time.perf_counter() - started
        return Reading(votes, [cache.plan(policy, policy.window, votes).kept for policy in policies], read_s, observe_s)
    finally:
        cache.ctx.close()


def agreement(reference: Reading, other: Reading, policies: list[SnapKV]) -> dict:
    overlap = {
        policy.budget: round(len(np.intersect1d(a, b)) / len(a), 4) for policy, a, b in zip(policies, reference.kept, other.kept)
    }
    return {"vote_correlation": round(float(np.corrcoef(reference.votes.ravel(), other.votes.ravel())[0, 1]), 6), "kept_overlap": overlap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1500,4000")
    parser.add_argument("--budgets", default="256,1024")
    parser.add_argument("--flash-type-k", default="f16", help="K cache type of the flash-attention reading")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    policies = [SnapKV(budget=int(budget), window=WINDOW) for budget in args.budgets.split(",")]
    with LlamaModel(resolve_model(args.model)) as model:
        for length in (int(n) for n in args.lengths.split(",")):
            case = needle_case(lambda text: len(model.tokenize(text)), length, 0.5, seed=7)
            tokens = chat_tokens(model, [{"role": "user", "content": f"{case.document}\n\n{case.question}"}])
            softmax = measure(model, tokens, policies)
            queries = measure(model, tokens, policies, query_scores=True)
            flash = measure(model, tokens, policies, flash_attn=True, type_k=args.flash_type_k)
            print(json.dumps({
                "tokens": len(tokens), "flash_type_k": args.flash_type_k,
                "probe": agreement(softmax, queries, policies),
                "flash_attention": agreement(softmax, flash, policies),
                "read_s": {"off": round(softmax.read_s, 2), "on": round(flash.read_s, 2)},
                "observe_s": {name: round(r.observe_s, 3) for name, r in (("softmax", softmax), ("queries", queries), ("flash", flash))},
            }), flush=True)


if __name__ == "__main__":
    main()
