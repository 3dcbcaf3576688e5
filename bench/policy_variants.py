"""Compare selection variants (head reduction, span-aware selection, pooling) on one read per case.

Usage: python bench/policy_variants.py [--cases N] [--length TOKENS] [--budgets 256,512,1024]
Each case is read once; every variant starts from a restored copy of that read, so the variants
differ only in what they keep. Prints one JSON line per (case, variant, budget) and a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace

from kvchat.bench.compare import answer_of, compare
from kvchat.bench.tasks import multikey_case, needle_case, score
from kvchat.engine import AskSettings, Engine
from kvchat.policy import Full, HeadReduction, SnapKV

VARIANTS = {
    f"{heads.value}{'' if spans == 'none' else '+' + spans}": SnapKV(heads=heads, spans=spans)
    for heads in HeadReduction
    for spans in ("none", "words", "sentences")
}
VARIANTS["normalized+words+avg5"] = SnapKV(heads=HeadReduction.NORMALIZED, spans="words", pool="avg", kernel=5)


def cases(engine: Engine, count: int, length: int, first_seed: int) -> list:
    count_tokens = lambda text: len(engine.model.tokenize(text))  # noqa: E731
    seeds = range(first_seed, first_seed + count)
    made = [multikey_case(count_tokens, length, 8, seed) for seed in seeds]
    made += [needle_case(count_tokens, length, depth, first_seed + i) for i, depth in enumerate((0.1, 0.5, 0.9))]
    return made


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--length", type=int, default=4000)
    parser.add_argument("--budgets", default="256,512,1024")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    chosen = {name: VARIANTS[name] for name in args.variants.split(",")}
    budgets = [int(b) for b in args.budgets.split(",")]
    engine = Engine(args.model, use_cache=False)
    totals: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for case in cases(engine, args.cases, args.length, args.first_seed):
        base = AskSettings(max_tokens=24)
        labelled = [
            (name, budget, replace(base, method=replace(policy, budget=budget)))
            for name, policy in [("full", Full())] + list(chosen.items())
            for budget in (budgets if name != "full" else budgets[:1])
        ]
        for _, index, events in compare(engine, [case], [s for *_, s in labelled]):
            name, budget, _ = labelled[index]
            done = answer_of(events)
            value = score(done.answer, case.answers)
            totals[(case.task, name, budget)].append(value)
            print(json.dumps({"task": case.task, "meta": case.meta, "variant": name, "budget": budget,
                              "prompt": done.stats.prompt_tokens, "score": value, "answer": done.answer[:60]}), flush=True)
    for (task, name, budget), values in sorted(totals.items()):
        print(f"{task:9s} {name:24s} {budget:5d} {sum(values)/len(values):.2f} ({len(values)})", file=sys.stderr)


if __name__ == "__main__":
    main()
