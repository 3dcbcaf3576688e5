"""Follow-up questions: accuracy of each selection strategy over a conversation.

Usage: python bench/multi_turn.py [--cases 4] [--length 4000] [--budget 256] [--heads sum,per-head]
Each case hides three facts at 10 %, 50 % and 90 % depth and asks about them in turn. The
document is read once (saved in a temporary state store); every strategy's conversation loads it.
With several --heads, each snapkv strategy runs once per head setting ("question per-head").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace

from kvchat.bench.compare import case_document
from kvchat.bench.tasks import Case, multi_turn_case, score
from kvchat.engine import AskSettings, Engine
from kvchat.events import Done
from kvchat.policy import SnapKV, method_carrying

STRATEGIES = {"question": "snapkv", "reuse": "snapkv", "document": "snapkv", "full": "full"}


def run_case(engine: Engine, case, settings: AskSettings, heads: list[str]) -> dict[str, list[float]]:
    document = case_document(Case("multiturn", case.document, "", ()))
    scores: dict[str, list[float]] = {}
    runs = [(strategy, method, each) for strategy, method in STRATEGIES.items() for each in (heads if method != "full" else heads[:1])]
    for strategy, method, each in runs:
        label = strategy if len(heads) == 1 or method == "full" else f"{strategy} {each}"
        method_settings = method_carrying(method, {"heads": each}, budget=settings.method.budget)
        conversation = engine.conversation(document, replace(settings, method=method_settings, select="question" if strategy == "full" else strategy))
        try:
            for _ in conversation.open():
                pass
            results = []
            for question, answers in zip(case.questions, case.answers):
                done = [e for e in engine.answer(conversation, question) if isinstance(e, Done)][0]
                results.append(score(done.answer, answers))
            scores[label] = results
        finally:
            conversation.close()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--length", type=int, default=4000)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--heads", default="sum", help="comma-separated: sum, normalized, topk-count, max, per-head")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    os.environ["KVCHAT_HOME"] = tempfile.mkdtemp(prefix="kvchat-bench-")
    settings = AskSettings(method=SnapKV(budget=args.budget), max_tokens=24)
    totals: dict[str, list[list[float]]] = defaultdict(list)
    with Engine(args.model) as engine:
        count_tokens = lambda text: len(engine.model.tokenize(text))  # noqa: E731
        for seed in range(args.cases):
            case = multi_turn_case(count_tokens, args.length, (0.1, 0.5, 0.9), seed)
            for strategy, results in run_case(engine, case, settings, args.heads.split(",")).items():
                totals[strategy].append(results)
                print(json.dumps({"seed": seed, "strategy": strategy, "scores": results}), flush=True)
    for strategy, rows in totals.items():
        per_turn = [sum(row[i] for row in rows) / len(rows) for i in range(len(rows[0]))]
        print(f"{strategy:9s} per turn {per_turn}  overall {sum(per_turn) / len(per_turn):.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
