"""Decode speed and memory of snapkv vs the full cache on the same prompt, in one process.

Usage: python bench/decode_speed.py [--lengths 8000,16000] [--budget 1024] [--tokens 128]
Each prompt (essay haystack + a needle question) is read once; both methods start from a
restored copy of that read and generate exactly --tokens tokens, so the ratio is fair.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from kvchat.bench.compare import answer_of, compare
from kvchat.bench.tasks import needle_case
from kvchat.engine import AskSettings, Engine
from kvchat.policy import Full, SnapKV


def measure(engine: Engine, length: int, budget: int, tokens: int) -> dict[str, object]:
    case = needle_case(lambda text: len(engine.model.tokenize(text)), length, 0.5, seed=length)
    snapkv = AskSettings(method=SnapKV(budget=budget), max_tokens=tokens, stop_at_end=False)
    results: dict[str, object] = {"length": length, "budget": budget}
    variants = [replace(snapkv, method=Full(budget=budget)), snapkv]
    for _, index, events in compare(engine, [case], variants):
        done = answer_of(events)
        results["length"] = done.stats.prompt_tokens
        results[variants[index].method.name] = {
            "decode_tokens_per_s": round(done.stats.decode_tokens_per_s, 2),
            "generated": done.stats.generated_tokens,
            "kv_mib_kept": round(done.stats.kv_bytes_kept / 2**20, 1),
            "prefill_tokens_per_s": round(done.stats.prefill_tokens_per_s, 1),
        }
    results["decode_speedup"] = round(
        results["snapkv"]["decode_tokens_per_s"] / results["full"]["decode_tokens_per_s"], 2  # type: ignore[index]
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="8000,16000")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    with Engine(args.model, use_cache=False) as engine:
        for length in (int(n) for n in args.lengths.split(",")):
            print(json.dumps(measure(engine, length, args.budget, args.tokens)), flush=True)


if __name__ == "__main__":
    main()
