"""How well the wording tells a question about the whole document from a lookup
(kvchat/engine/answering/whole_question.py), on labelled questions, no model needed.

Usage: python bench/whole_questions.py [--leval-data LEval/LEval-data] [--show]

The rules were written on the dev part and are reported on the held-out part and on questions
written as users ask them:
- dev: the shipped cuad questions (lookups) and cuad-lists questions (whole); with L-Eval's data,
  the first half of each task's documents: GovReport's summaries and QMSum's "Summarize the
  (whole) meeting" (whole), QMSum's other queries, Qasper's, NQ's and the earnings calls'
  questions (lookups).
- held-out: bench/cuad_heldout's questions and lists, and L-Eval's second halves.
- users: the questions below, written before the rules were run on them.
Each question counts once (L-Eval repeats some).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from kvchat.engine import about_whole

ROOT = Path(__file__).resolve().parents[1]
CUAD = {"dev": ROOT / "kvchat" / "bench" / "data" / "cuad", "held-out": ROOT / "bench" / "cuad_heldout"}
WHOLE_MEETING = re.compile(r"^summari[sz]e the (whole )?meeting\.?$", re.I)
LOOKUP_TASKS = ("scientific_qa", "natural_question", "financial_qa")
USERS_WHOLE = [
    "Summarize this agreement.", "Give me a summary of the contract.", "What is this document about?",
    "List every obligation of the reseller.", "What are all the ways either party can terminate?",
    "How do the two contracts differ on liability?", "What are the key terms of this agreement?",
    "Give me an overview of the report.", "tl;dr", "What are the main points of this paper?",
    "List all the dates and deadlines in this contract.", "Which clauses should a lawyer review before I sign?",
    "Summarize the whole meeting.", "What are the risks for the licensee in this agreement?",
    "Outline the structure of this document.", "Compare the payment terms of the two agreements.",
]
USERS_LOOKUP = [
    "What is the termination clause?", "Who are the parties?", "When does the agreement expire?",
    "What law governs the contract?", "How much is the minimum fee?", "Can the reseller assign the agreement?",
    "What happens if the licensee does not pay?", "What is the notice period to terminate the renewal?",
    "Is there a cap on liability?", "Who owns the intellectual property created under the agreement?",
    "Summarize the confidentiality clause.", "What does section 4.2 say?", "What did the project manager say about the budget?",
    "Summarize the discussion on the remote control design.", "What territory does the license cover?",
    "Does the contract have a non-compete?",
]


def _questions(path: Path) -> list[str]:
    return [item["question"] for item in json.loads(path.read_text())["questions"]]


def _leval_half(folder: Path, task: str, part: str) -> list[str]:
    """The questions of the dev (first, rounded up) or held-out half of a task's documents."""
    path = next(folder.rglob(f"{task}.jsonl"))
    documents = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    half = (len(documents) + 1) // 2
    chosen = documents[:half] if part == "dev" else documents[half:]
    return [question for document in chosen for question in document["instructions"]]


def labelled(part: str, leval: Path | None) -> tuple[list[str], list[str]]:
    """(whole, lookups) of a part, each question once."""
    whole, lookups = _questions(CUAD[part] / "lists.json"), _questions(CUAD[part] / "questions.json")
    if leval is not None:
        whole += _leval_half(leval, "gov_report_summ", part)
        for question in _leval_half(leval, "meeting_summ", part):
            (whole if WHOLE_MEETING.match(question.strip()) else lookups).append(question)
        for task in LOOKUP_TASKS:
            lookups += _leval_half(leval, task, part)
    return sorted(set(whole)), sorted(set(lookups) - set(whole))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leval-data", type=Path, help="L-Eval's data folder, for its questions too")
    parser.add_argument("--show", action="store_true", help="print the questions told wrong")
    args = parser.parse_args()
    sets = {part: labelled(part, args.leval_data) for part in CUAD} | {"users": (USERS_WHOLE, USERS_LOOKUP)}
    print("| questions | whole ones told whole | lookups told whole |")
    print("| --- | --- | --- |")
    for name, (whole, lookups) in sets.items():
        found, false = [q for q in whole if about_whole(q)], [q for q in lookups if about_whole(q)]
        print(f"| {name} | {len(found)} / {len(whole)} | {len(false)} / {len(lookups)} |")
        if args.show:
            for line in [f"  missed: {q}" for q in whole if q not in found] + [f"  taken for whole: {q}" for q in false]:
                print(line)


if __name__ == "__main__":
    main()
