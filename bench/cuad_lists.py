"""Write the `cuad-lists` task's questions from CUAD's annotations: for each contract, every
category the experts marked in two clauses or more (but the parties, which are names), one
question asking for all of them, with the clauses' text. The question names the category alone:
with CUAD's description after it, a yes-or-no question ("Does a party have the right to audit
…?"), the default model answered that question and quoted nothing (docs/bench/design-history.md,
"cuad-lists asks for the category alone").

Usage: python bench/cuad_lists.py CUAD_ANNOTATIONS_JSON
    (annotations.json: per contract, per category, the experts' clauses, derived from CUAD v1's
    master_clauses.csv); writes kvchat/bench/data/cuad/lists.json for the shipped contracts and
    bench/cuad_heldout/lists.json for the two held-out ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "kvchat" / "bench" / "data" / "cuad"
HELD_OUT = ROOT / "bench" / "cuad_heldout"
SOURCE = ("Questions for kvchat's cuad-lists task, derived mechanically from CUAD v1's expert annotations (CC BY 4.0, "
          "The Atticus Project) by bench/cuad_lists.py: every category with two clauses or more (a clause inside another counted once), the parties left out.")


def _short(contract: str) -> str:
    """The contract's short name as the cuad questions' ids have it (`cuad_tom_online_…` is tomonline)."""
    words = contract.removeprefix("cuad_").split("_")
    return {"digital": "cinema", "tom": "tomonline", "buffalo": "bww", "mrs": "mrsfields", "manufacturers": "msl"}.get(words[0], words[0])


def _flat(text: str) -> str:
    return " ".join(text.split())


def _outermost(clauses: list[str]) -> list[str]:
    """The clauses, those that lie inside another left out (one quote would count for both)."""
    return [clause for clause in clauses if not any(_flat(clause) in _flat(other) and other != clause for other in clauses)]


def lists_of(contract: dict) -> list[dict]:
    questions = []
    for category in contract["categories"]:
        clauses = _outermost([clause["text"] for clause in category.get("clauses") or []])
        if len(clauses) < 2 or category["category"] == "Parties":
            continue
        name = category["category"]
        questions.append({
            "id": f"{_short(contract['id'])}.{name.lower().replace(' ', '_').replace('/', '_').replace('-', '_')}",
            "contract": contract["id"], "category": name,
            "question": f"List and quote every clause of this contract about {name.lower()}.",
            "clauses": clauses,
        })
    return questions


def main() -> None:
    contracts = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))["contracts"]
    for folder in (SHIPPED, HELD_OUT):
        asked = {item["contract"] for item in json.loads((folder / "questions.json").read_text(encoding="utf-8"))["questions"]}
        questions = [question for contract in contracts if contract["id"] in asked for question in lists_of(contract)]
        (folder / "lists.json").write_text(json.dumps({"source": SOURCE, "questions": questions}, indent=1) + "\n", encoding="utf-8")
        print(f"{folder / 'lists.json'}: {len(questions)} questions")


if __name__ == "__main__":
    main()
