"""The `cuad` task: questions people ask about real contracts, with the answers CUAD's experts marked.

The seven contracts and the questions ship in `data/cuad/` (CUAD v1, CC BY 4.0; see SOURCE.md
there); another folder laid out the same way (questions.json and one <contract>.txt per contract
it names) can stand in for it: other contracts, or held-out questions. A contract longer than the
tested model can read whole is cut in the middle, the head and the tail kept (as LongBench
truncates), so that every method, the full cache included, reads the same text; a question whose evidence the cut removes is not asked. Answers are scored with
the normalized match of `kvchat.bench.answers`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kvchat.bench.tasks import Case, CountTokens
from kvchat.errors import SettingsError

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


Folder = Traversable | Path


def data_folder(folder: Folder | None) -> Folder:
    return resources.files("kvchat.bench") / "data" / "cuad" if folder is None else folder


@cache
def cuad_questions(folder: Folder | None = None) -> tuple[CuadQuestion, ...]:
    """The questions of `folder` (default: the shipped ones), in the file's order."""
    path = data_folder(folder) / "questions.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SettingsError(f"cannot read cuad questions {path}: {error}", "give a folder with a questions.json like kvchat/bench/data/cuad's") from None
    return tuple(
        CuadQuestion(item["id"], item["contract"], item["category"], item["question"], tuple(item["answers"]),
                     tuple(item.get("refuse", ())), item["evidence"], item["cuad_answer"])
        for item in spec["questions"]
    )


def cuad_ids_named(names: tuple[str, ...], folder: Folder | None = None) -> tuple[str, ...]:
    """The ids of the questions `names` names: a question's id (`todos.law`) or a contract's short
    name, all of its questions (`todos`)."""
    known = [item.id for item in cuad_questions(folder)]
    unknown = [name for name in names if not any(_named(i, name) for i in known)]
    if unknown:
        contracts = ", ".join(dict.fromkeys(i.split(".")[0] for i in known))
        raise SettingsError(f"unknown cuad question(s) {unknown}", f"name a question such as todos.law or a contract: {contracts}")
    return tuple(i for i in known if any(_named(i, name) for name in names))


def _named(question_id: str, name: str) -> bool:
    """Whether `name` is the question's id or its contract's short name (the id's first part)."""
    return question_id == name or question_id.startswith(f"{name}.")


@cache
def contract_text(contract: str, folder: Folder | None = None) -> str:
    path = data_folder(folder) / f"{contract}.txt"
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError) as error:
        raise SettingsError(f"cannot read contract {path}: {error}", "put each contract questions.json names next to it as <contract>.txt") from None


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


def cuad_contracts(folder: Folder | None = None) -> list[str]:
    """The contracts the questions ask about, shortest first (the first results come soonest)."""
    contracts = dict.fromkeys(item.contract for item in cuad_questions(folder))
    return sorted(contracts, key=lambda contract: len(contract_text(contract, folder)))


def cuad_cases(count_tokens: CountTokens, max_document_tokens: int, ids: tuple[str, ...] | None = None,
               folder: Folder | None = None) -> list[Case]:
    """One case per question (those of `ids`, or all), contract by contract, each contract cut to
    `max_document_tokens`; questions whose evidence the cut removed are left out."""
    unknown = set(ids or ()) - {item.id for item in cuad_questions(folder)}
    if unknown:
        raise ValueError(f"unknown cuad question(s) {sorted(unknown)}")
    asked = [item for item in cuad_questions(folder) if ids is None or item.id in ids]
    cases = []
    for contract in cuad_contracts(folder):
        questions = [item for item in asked if item.contract == contract]
        if not questions:
            continue
        full = contract_text(contract, folder)
        document = cut_to_tokens(full, count_tokens, max_document_tokens)
        cases += [Case("cuad", document, item.question, item.answers,
                       {"contract": contract, "category": item.category, "id": item.id, "cut": document != full},
                       scoring="normalized", refuse=item.refuse)
                  for item in questions if item.evidence in document]
    return cases
