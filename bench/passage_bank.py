"""Later questions from a passage bank, beside the first answer's fresh reading of the same passages
and the whole reading's selection (today's follow-up), on cuad's dev contracts (or L-Eval's documents).

Usage: python bench/passage_bank.py [--skip 0] [--contracts 2] [--max-document-tokens 16000] [--cuad-data FOLDER]
       [--model default] [--draft small] [--budget 1024] [--bank-budgets 1024,2048] [--read auto] [--max-tokens 512]
       [--no-fresh] [--retrieval] [--no-whole] [--saved]
       [--leval-data FOLDER --leval-tasks leval-legal,… --leval-part held-out --leval-skip 2 --leval-docs 1 --leval-questions 10]

Each contract's questions are answered four ways, each question on its own (no earlier turn):
`fresh`, the default first answer (the passages the question's words choose, read alone now);
`retrieval` (`--retrieval`), what a user would pick instead: `--read retrieval`, read alone now;
`bank`, the same choice loaded from the contract's passage bank, read once before
(engine/reading/passage_bank.py, its entries packed as it holds and saves them); `bank@N`, the bank's questions at another budget N
(`--bank-budgets`: loading more passages costs little, reading none); `whole`, SnapKV at the budget from the contract's whole reading, saved once and loaded for each
question as a later `kvchat ask` loads it (its first token counts the loading).
One JSON line per answer, then one per contract with the readings' times, then the totals. Use a
KVCHAT_HOME where the contracts' readings are not saved (else the whole reading is loaded), or
--saved to answer again from the readings an earlier run saved there (its bank_read_s null). With
--leval-data, the documents are L-Eval's (kvchat bench's selection: its options of the same names),
each one a "contract" named task#document, scored by its task's metric.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from collections.abc import Iterator

from kvchat.bench.compare import case_document, for_case
from kvchat.bench.cuad import cuad_cases
from kvchat.bench.leval import LevalSelection, leval_cases
from kvchat.bench.tasks import Case, case_score
from kvchat.engine import AskSettings, Conversation, Engine
from kvchat.events import Done, Event
from kvchat.policy import SnapKV


def _timed(events: Iterator[Event]) -> float:
    started = time.perf_counter()
    for _ in events:
        pass
    return round(time.perf_counter() - started, 1)


def _document_of(case: Case) -> str:
    return case.meta.get("contract") or f"{case.task}#{case.meta['document']}"


def _id_of(case: Case) -> str:
    return case.meta.get("id") or f"{case.task}#{case.meta['document']}.{case.meta['question']}"


def _cases(args: argparse.Namespace, count_tokens) -> list[Case]:
    if args.leval_data is None:
        return cuad_cases(count_tokens, args.max_document_tokens, folder=args.cuad_data)
    selection = LevalSelection(part=args.leval_part, skip=args.leval_skip, documents=args.leval_docs, questions=args.leval_questions)
    return leval_cases(count_tokens, args.max_document_tokens, tuple(args.leval_tasks.split(",")), args.leval_data, selection)


def _answers(engine: Engine, conversation: Conversation, cases: list[Case], settings: AskSettings, way: str) -> Iterator[dict]:
    for case in cases:
        conversation.reset()  # each question as a first one: the ways differ only in the reading
        done = [event for event in engine.answer(conversation, case.question, for_case(settings, case)) if isinstance(event, Done)][0]
        yield {"way": way, "id": _id_of(case), "score": case_score(case, done.answer), "ttft_s": round(done.stats.ttft_s, 2),
               "read": done.stats.read, "kept": done.stats.kept_tokens, "answer": done.answer.strip()[:300]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", type=int, default=0, help="leave out the first (shortest) dev contracts")
    parser.add_argument("--contracts", type=int, default=2, help="how many dev contracts, shortest first")
    parser.add_argument("--max-document-tokens", type=int, default=16000)
    parser.add_argument("--cuad-data", type=Path, help="another folder of cuad questions and contracts (kvchat bench --cuad-data)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--draft", default="small", help="none: the model's own first layers choose where no word matches")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--bank-budgets", default="", help="more budgets the bank's questions are answered at, e.g. 2048")
    parser.add_argument("--read", default="auto", help="how the fresh and the bank's questions choose (kvchat ask --read)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--no-fresh", action="store_true", help="leave out the fresh readings' answers")
    parser.add_argument("--retrieval", action="store_true", help="add retrieval's answers (--read retrieval), read fresh")
    parser.add_argument("--no-whole", action="store_true", help="leave out the whole reading's follow-ups")
    parser.add_argument("--saved", action="store_true",
                        help="load a bank (and a whole reading) KVCHAT_HOME has saved instead of reading it again: the answers only")
    parser.add_argument("--leval-data", type=Path, help="L-Eval's LEval-data folder: its documents instead of cuad's")
    parser.add_argument("--leval-tasks", default="leval-legal,leval-financial,leval-nq,leval-multidoc")
    parser.add_argument("--leval-part", default="dev", choices=("dev", "held-out", "all"))
    parser.add_argument("--leval-skip", type=int, default=0)
    parser.add_argument("--leval-docs", type=int, default=1)
    parser.add_argument("--leval-questions", type=int, default=10)
    args = parser.parse_args()
    totals: dict[str, list[float]] = {}
    with Engine(args.model, draft=None if args.draft == "none" else args.draft) as engine:
        cases = _cases(args, engine.model.count_tokens)
        contracts = list(dict.fromkeys(_document_of(case) for case in cases))[args.skip : args.skip + args.contracts]
        for contract in contracts:
            asked = [case for case in cases if _document_of(case) == contract]
            record: dict[str, object] = {"contract": contract, "questions": len(asked)}
            settings = AskSettings(method=SnapKV(budget=args.budget), read=args.read, max_tokens=args.max_tokens)
            conversation = engine.conversation(case_document(asked[0]), for_case(settings, asked[0]))
            try:
                list(conversation.open())
                record["document_tokens"] = len(conversation.document_tokens)
                rows = [] if args.no_fresh else list(_answers(engine, conversation, asked, settings, "fresh"))
                if args.retrieval:
                    rows += _answers(engine, conversation, asked, replace(settings, read="retrieval"), "retrieval")
                loads = args.saved and conversation.bank_saved
                record["bank_read_s"] = None if loads else _timed(conversation.read_bank())
                rows += _answers(engine, conversation, asked, settings, "bank")
                record["bank_mib"] = round(conversation.bank.n_bytes / 2**20, 1)
                for budget in [int(budget) for budget in args.bank_budgets.split(",") if budget]:
                    wider = replace(settings, method=SnapKV(budget=budget))
                    rows += _answers(engine, conversation, asked, wider, f"bank@{budget}")
            finally:
                conversation.close()
            if not args.no_whole:
                whole = AskSettings(method=SnapKV(budget=args.budget), read="full", max_tokens=args.max_tokens)
                conversation = engine.conversation(case_document(asked[0]), for_case(whole, asked[0]))
                try:
                    record["whole_read_s"] = _timed(conversation.open())  # and saved (loaded with --saved)
                finally:
                    conversation.close()
                for case in asked:  # each loads the saved reading, as a later question does
                    conversation = engine.conversation(case_document(case), for_case(whole, case))
                    try:
                        list(conversation.open())
                        rows += _answers(engine, conversation, [case], whole, "whole")
                    finally:
                        conversation.close()
            for row in rows:
                print(json.dumps({"contract": contract, **row}), flush=True)
                totals.setdefault(row["way"], []).append(row["score"])
            print(json.dumps(record), flush=True)
    print(json.dumps({way: {"right": sum(scores), "of": len(scores)} for way, scores in totals.items()}), flush=True)


if __name__ == "__main__":
    main()
