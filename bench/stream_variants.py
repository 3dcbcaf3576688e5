"""Streamed reading: query-aware vs query-agnostic observation, and carried votes vs re-scoring.

Usage: python bench/stream_variants.py [--length 6000] [--budget 512] [--n-ctx 2048]
Each case is streamed once per variant (the reading itself differs), then answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace

from kvchat.bench.compare import case_document
from kvchat.bench.tasks import multikey_case, needle_case, score
from kvchat.engine import AskSettings, Engine, StreamSettings
from kvchat.events import Done
from kvchat.policy import SnapStream

VARIANTS = {
    "query-aware": StreamSettings(),
    "query-aware+carry0.5": StreamSettings(carry=0.5),
    "query-agnostic": StreamSettings(query_aware=False),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=6000)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--depths", type=lambda text: [float(d) for d in text.split(",")], default=[0.2, 0.5, 0.8])
    parser.add_argument("--multikey", type=int, default=2, help="multi-key cases (4 keys each)")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    settings = AskSettings(method=SnapStream(budget=args.budget), max_tokens=24, n_ctx=args.n_ctx)
    totals: dict[str, list[float]] = defaultdict(list)
    with Engine(args.model, use_cache=False) as engine:
        count_tokens = lambda text: len(engine.model.tokenize(text))  # noqa: E731
        cases = [needle_case(count_tokens, args.length, depth, seed) for seed, depth in enumerate(args.depths)]
        cases += [multikey_case(count_tokens, args.length, 4, seed) for seed in range(args.multikey)]
        for case in cases:
            for name, stream in VARIANTS.items():
                conversation = engine.conversation(case_document(case), replace(settings, stream=stream))
                try:
                    for _ in conversation.open(question=case.question):
                        pass
                    done = [e for e in engine.answer(conversation, case.question) if isinstance(e, Done)][0]
                finally:
                    conversation.close()
                value = score(done.answer, case.answers)
                totals[name].append(value)
                print(json.dumps({"task": case.task, "meta": case.meta, "variant": name, "score": value,
                                  "prompt": done.stats.prompt_tokens, "answer": done.answer[:50]}), flush=True)
    for name, values in totals.items():
        print(f"{name:22s} {sum(values) / len(values):.2f} ({len(values)})", file=sys.stderr)


if __name__ == "__main__":
    main()
