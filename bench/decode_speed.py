"""Decode speed and memory of snapkv vs the full cache on the same prompt, in one process.

Usage: python bench/decode_speed.py [--lengths 8000,16000] [--budget 1024] [--tokens 128]
       [--heads sum,per-head]
Each prompt (essay haystack + a needle question) is read once; every method starts from a
restored copy of that read and generates exactly --tokens tokens, so the ratio is fair. With
several --heads, snapkv runs once per head setting, and each reports the seconds its selection
took to rewrite the cache (compaction) against the reading's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from kvchat.bench.compare import answer_of, compare
from kvchat.bench.tasks import needle_case
from kvchat.engine import AskSettings, Engine
from kvchat.events import Pruned
from kvchat.policy import Full, SnapKV


def measure(engine: Engine, length: int, budget: int, tokens: int, heads: list[str]) -> dict[str, object]:
    case = needle_case(lambda text: len(engine.model.tokenize(text)), length, 0.5, seed=length)
    base = AskSettings(method=Full(budget=budget), max_tokens=tokens)
    labelled = [("full", base)] + [
        ("snapkv" if each == "sum" else f"snapkv {each}", replace(base, method=SnapKV(budget=budget, heads=each)))
        for each in heads
    ]
    results: dict[str, object] = {"length": length, "budget": budget}
    for _, index, events in compare(engine, [case], [settings for _, settings in labelled], decode_all=True):
        done = answer_of(events)
        pruned = [event for event in events if isinstance(event, Pruned)]
        results["length"] = done.stats.prompt_tokens
        results[labelled[index][0]] = {
            "decode_tokens_per_s": round(done.stats.decode_tokens_per_s, 2),
            "generated": done.stats.generated_tokens,
            "kv_mib_kept": round(done.stats.kv_bytes_kept / 2**20, 1),
            "read_s": round(done.stats.prompt_tokens / done.stats.prefill_tokens_per_s, 1),
            "compact_s": round(pruned[0].compact_s, 3) if pruned else 0.0,
            "answer": done.answer[:80],
        }
    full_speed = results["full"]["decode_tokens_per_s"]  # type: ignore[index]
    for label, _ in labelled[1:]:
        results[label]["decode_speedup"] = round(results[label]["decode_tokens_per_s"] / full_speed, 2)  # type: ignore[index]
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="8000,16000")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--heads", default="sum", help="comma-separated: sum, normalized, topk-count, max, per-head")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    with Engine(args.model, use_cache=False) as engine:
        for length in (int(n) for n in args.lengths.split(",")):
            print(json.dumps(measure(engine, length, args.budget, args.tokens, args.heads.split(","))), flush=True)


if __name__ == "__main__":
    main()
