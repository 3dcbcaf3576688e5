"""The `cuad` task: questions people ask about real contracts, with the answers CUAD's experts marked.

The seven contracts and the questions ship in `data/cuad/` (CUAD v1, CC BY 4.0; see SOURCE.md
there). A contract longer than the tested model can read whole is cut in the middle, the head
and the tail kept (as LongBench truncates), so that every method, the full cache included, reads
the same text; a question whose evidence the cut removes is not asked. Answers are scored with
the normalized match of `kvchat.bench.answers`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from kvchat.bench.tasks import Case, CountTokens
from kvchat.errors import SettingsError

CUAD_CONTRACTS = (  # shortest first
    "cuad_todos_medical_marketing_reseller",
    "cuad_corio_license_hosting",
    "cuad_energous_strategic_alliance",
    "cuad_buffalo_wild_wings_franchise",
    "cuad_mrs_fields_franchise",
    "cuad_array_biopharma_license_development",
    "cuad_manufacturers_services_outsourcing",
)
OMISSION = "\n\n[...]\n\n"  # written where the middle of a long contract was cut out


@dataclass(frozen=True)
class CuadQuestion:
    id: str
    contract: str
    category: str
    question: str
    answers: tuple[str, ...]
    refuse: tuple[str, ...]
    evidence: str
    cuad_answer: str


def _data_folder():
    return resources.files("kvchat.bench") / "data" / "cuad"


@cache
def cuad_questions() -> tuple[CuadQuestion, ...]:
    spec = json.loads((_data_folder() / "questions.json").read_text(encoding="utf-8"))
    return tuple(
        CuadQuestion(item["id"], item["contract"], item["category"], item["question"], tuple(item["answers"]),
                     tuple(item.get("refuse", ())), item["evidence"], item["cuad_answer"])
        for item in spec["questions"]
    )


def cuad_ids_named(names: tuple[str, ...]) -> tuple[str, ...]:
    """The ids of the questions `names` names: a question's id (`todos.law`) or a contract's short
    name, all of its questions (`todos`)."""
    known = [item.id for item in cuad_questions()]
    unknown = [name for name in names if not any(i == name or i.startswith(f"{name}.") for i in known)]
    if unknown:
        contracts = ", ".join(dict.fromkeys(i.split(".")[0] for i in known))
        raise SettingsError(f"unknown cuad question(s) {unknown}", f"name a question such as todos.law or a contract: {contracts}")
    return tuple(i for i in known if any(i == name or i.startswith(f"{name}.") for name in names))


@cache
def contract_text(contract: str) -> str:
    return (_data_folder() / f"{contract}.txt").read_text(encoding="utf-8")


def _head_end(text: str, count_tokens: CountTokens, tokens: int) -> int:
    """The largest offset, at a space, whose prefix is at most `tokens` tokens."""
    low, high = 0, len(text)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if count_tokens(text[:middle]) <= tokens else (low, middle)
    space = text.rfind(" ", 0, low)
    return space if space > 0 else low


def _tail_start(text: str, count_tokens: CountTokens, tokens: int) -> int:
    """The smallest offset, just after a space, whose suffix is at most `tokens` tokens."""
    low, high = 0, len(text)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if count_tokens(text[middle:]) <= tokens else (middle, high)
    space = text.find(" ", high)
    return space + 1 if space >= 0 else high


def cut_to_tokens(text: str, count_tokens: CountTokens, max_tokens: int) -> str:
    """The text if it has at most `max_tokens` tokens; else its head and tail, about half each,
    joined by OMISSION, at most `max_tokens` tokens in all."""
    if count_tokens(text) <= max_tokens:
        return text
    half = (max_tokens - count_tokens(OMISSION)) // 2
    while True:
        cut = text[:_head_end(text, count_tokens, half)] + OMISSION + text[_tail_start(text, count_tokens, half):]
        if count_tokens(cut) <= max_tokens:
            return cut
        half -= max(1, half // 100)  # the halves' tokens did not quite add up: shrink a little


def cuad_cases(count_tokens: CountTokens, max_document_tokens: int, ids: tuple[str, ...] | None = None) -> list[Case]:
    """One case per question (those of `ids`, or all), contract by contract, each contract cut to
    `max_document_tokens`; questions whose evidence the cut removed are left out."""
    unknown = set(ids or ()) - {item.id for item in cuad_questions()}
    if unknown:
        raise ValueError(f"unknown cuad question(s) {sorted(unknown)}")
    asked = [item for item in cuad_questions() if ids is None or item.id in ids]
    cases = []
    for contract in CUAD_CONTRACTS:
        questions = [item for item in asked if item.contract == contract]
        if not questions:
            continue
        full = contract_text(contract)
        document = cut_to_tokens(full, count_tokens, max_document_tokens)
        cases += [Case("cuad", document, item.question, item.answers,
                       {"contract": contract, "category": item.category, "id": item.id, "cut": document != full},
                       scoring="normalized", refuse=item.refuse)
                  for item in questions if item.evidence in document]
    return cases
