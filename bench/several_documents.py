"""Several documents asked about together: accuracy of block-wise reading (each document read on
its own, the readings put together: what kvchat does, so that each reading is saved and reused
alone) against reading the documents as one text, on the same tokens and questions.

Usage: python bench/several_documents.py [--pairs todos+corio,energous+todos] [--model default]
    [--budget 1024] [--json out.json]

Each pair of shipped CUAD contracts is asked every cuad question of either contract, naming the
contract it is about ("In cuad_todos_….txt: …"), and one comparison: which law governs each (both
laws must be in the answer). Answers are scored as `kvchat bench --tasks cuad` scores them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvchat.bench.answers import answer_matches
from kvchat.bench.cuad import contract_text, cuad_contracts, cuad_questions
from kvchat.documents import Document, bundle
from kvchat.engine import AskSettings, ComposedReading, Engine
from kvchat.events import Done
from kvchat.policy import SnapKV

MODES = {"block-wise": ComposedReading(), "one text": None}  # the way of reading asked for (None: the default)


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    answers: tuple[tuple[str, ...], ...]  # each group must be matched (a comparison has two)
    refuse: tuple[str, ...] = ()


def _contract(name: str) -> str:
    (contract,) = [c for c in cuad_contracts() if name in c]
    return contract


def pair_questions(first: str, second: str) -> list[Question]:
    questions: list[Question] = []
    laws = {}
    for contract in (first, second):
        for item in cuad_questions():
            if item.contract == contract:
                text = f"In {contract}.txt: {item.question}"
                questions.append(Question(item.id, text, (item.answers,), item.refuse))
                if item.category == "Governing Law":
                    laws[contract] = item.answers
    if len(laws) == 2:
        questions.append(Question("compare.law", "Which law governs each of the two agreements?",
                                  (laws[first], laws[second])))
    return questions


def answer_right(answer: str, question: Question) -> bool:
    return all(answer_matches(answer, golds, question.refuse) for golds in question.answers)


def run_pair(engine: Engine, first: str, second: str, settings: AskSettings) -> list[dict[str, object]]:
    document = bundle([Document.from_pages(Path(f"{c}.txt"), "text", [contract_text(c)]) for c in (first, second)])
    records = []
    for mode, reading in MODES.items():
        conversation = engine.conversation(document, settings, reading=reading)
        try:
            started = time.perf_counter()
            for _ in conversation.open():
                pass
            read_s = time.perf_counter() - started
            for question in pair_questions(first, second):
                conversation.reset()
                done = [event for event in engine.answer(conversation, question.text) if isinstance(event, Done)][0]
                record = {"pair": f"{first}+{second}", "mode": mode, "id": question.id, "answer": done.answer,
                          "right": answer_right(done.answer, question), "read_s": round(read_s, 1),
                          "prompt_tokens": done.stats.prompt_tokens}
                print(json.dumps(record), flush=True)
                records.append(record)
        finally:
            conversation.close()
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", default="todos+corio,energous+todos")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    parser.add_argument("--budget", type=int, default=SnapKV.budget)
    parser.add_argument("--json", type=Path, help="write every record here")
    args = parser.parse_args()
    settings = AskSettings(method=SnapKV(budget=args.budget), max_tokens=48)
    records = []
    with Engine(args.model, use_cache=False) as engine:
        for pair in args.pairs.split(","):
            first, second = (_contract(name) for name in pair.split("+"))
            records += run_pair(engine, first, second, settings)
    for mode in MODES:
        rows = [record for record in records if record["mode"] == mode]
        right = sum(bool(record["right"]) for record in rows)
        print(f"{mode:10s} {right}/{len(rows)} right ({100 * right / max(len(rows), 1):.0f} %)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
