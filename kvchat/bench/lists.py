"""The `cuad-lists` task: questions whose answer is every clause of a kind in a contract ("List
and quote every clause of this contract about audit rights: …"), from CUAD's expert annotations:
each category the experts marked in two clauses or more (`lists.json` beside the cuad questions,
written by bench/cuad_lists.py). An answer scores the share of those clauses it quotes
(clauses.py). A contract is cut as the cuad task cuts it; clauses the cut
removed are not asked for, and a question left with fewer than two is not asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from kvchat.bench.cuad import Folder, contract_text, cut_to_tokens, data_folder
from kvchat.bench.tasks import Case, CountTokens
from kvchat.errors import SettingsError

LIST_MAX_TOKENS = 384  # room for several clauses, each quoted in part


@dataclass(frozen=True)
class ListQuestion:
    id: str
    contract: str
    category: str
    question: str
    clauses: tuple[str, ...]


@cache
def list_questions(folder: Folder | None = None) -> tuple[ListQuestion, ...]:
    """The list questions of `folder` (default: the shipped ones), in the file's order."""
    path = data_folder(folder) / "lists.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        return tuple(ListQuestion(item["id"], item["contract"], item["category"], item["question"], tuple(item["clauses"]))
                     for item in spec["questions"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SettingsError(f"cannot read cuad list questions {path}: {error}",
                            "write them with python bench/cuad_lists.py, or leave cuad-lists out") from None


def _in(flat_document: str, clause: str) -> bool:
    """Whether each fragment of the clause's text is in the document (its words joined by single spaces)."""
    return all(" ".join(fragment.split()) in flat_document for fragment in clause.split("<omitted>"))


def list_cases(count_tokens: CountTokens, max_document_tokens: int, contracts: tuple[str, ...] | None = None,
               folder: Folder | None = None) -> list[Case]:
    """One case per list question about `contracts` (short names, as the question ids begin; None:
    all), contract by contract, each cut as the cuad task cuts it."""
    asked = [item for item in list_questions(folder) if contracts is None or item.id.split(".")[0] in contracts]
    cases = []
    for contract in dict.fromkeys(item.contract for item in asked):
        full = contract_text(contract, folder)
        document = cut_to_tokens(full, count_tokens, max_document_tokens)
        flat = " ".join(document.split())
        for item in (item for item in asked if item.contract == contract):
            clauses = tuple(clause for clause in item.clauses if _in(flat, clause))
            if len(clauses) >= 2:
                cases.append(Case("cuad-lists", document, item.question, clauses,
                                  {"contract": contract, "category": item.category, "id": item.id, "cut": document != full},
                                  scoring="clauses", max_tokens=LIST_MAX_TOKENS))
    return cases
