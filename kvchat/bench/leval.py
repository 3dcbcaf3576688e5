"""L-Eval's long-document tasks (An et al., ACL 2024), asked as its own baselines ask them and
scored with its metrics (leval_metrics.py), from a local copy of its data.

L-Eval's data is not shipped (its repository is GPL-3.0): `--leval-data DIR` names a folder that
holds its task files (`git clone https://github.com/OpenLMLab/LEval` and give `LEval/LEval-data`,
or any folder with `<task>.jsonl` files up to two levels down). Each line of a task file is one
document with its questions (`instructions`), reference answers (`outputs`) and how L-Eval scores
them (`evaluation`); documents scored by people or by an LLM judge are left out, as L-Eval's own
automatic evaluation leaves them out.

The prompt follows L-Eval's baseline for chat models (Baselines/LEval_config.py and
llama2-chat-test.py at cd34b05): the task's system prompt, the document, then for the exam tasks
"{question}.  Please directly give the answer without any additional output or explanation", and
for the open-ended ones "{question} \\nAnswer this question with N words." (N: the reference's
words, as L-Eval does). What differs: the model's own chat template (kvchat writes "Question: "
before the question, where L-Eval writes "Question: " or "Instruction: "); no "Answer:" after the
template; answers are cut at 32 tokens for the exam tasks and at about 1.5 tokens a reference word
(at most L-Eval's 512) for the open-ended ones; SFiction is scored on its loyalty half alone (its
fact half asks without the document). A document longer than the model reads whole keeps its
head, as L-Eval truncates, leaving room for the system prompt and the longest answer.

Every decision is made on the `dev` part (the first half of each task's documents, in file
order); the `held-out` part (the rest) is for reporting once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvchat.bench.tasks import Case, CountTokens
from kvchat.errors import SettingsError

_EXAM_SYSTEM = ("Now you are given a very long document. Please follow the instruction based on this document. For "
                "multi-choice questions, there is only a sinlge correct option. Please only provide the letter corresponding "
                "to the answer (like A or B) when answering. For other questions, please directly give the concise and "
                "accurate answer. ")  # L-Eval's wording, its typo kept: the prompt is part of the benchmark
_COURSERA_SYSTEM = ("Now you are given a very long document. Please follow the instruction based on this document. For "
                    "multi-choice questions, there could be a sinlge correct option or multiple correct options. Please only "
                    "provide the letter corresponding to the answer (like A or AB) when answering. ")
_SCIFI_SYSTEM = ("Now you are given a scientific fiction. I will ask you some questions and the answer should be \"True\" or "
                 "\"False\". Notice that you should answer the question based on the evidence in the document instead of your "
                 "background knowledge.")
_OPEN_SYSTEM = ("Now you are given a very long document. Please follow the instruction after this document. These "
                "instructions may include summarizing a document, answering questions based on the document, or writing a "
                "required paragraph. ")
_EXAM_SUFFIX = ".  Please directly give the answer without any additional output or explanation"
EXAM_MAX_TOKENS = 32  # a letter, or True/False, with room for a model that says more
MAX_NEW_TOKENS = 512  # L-Eval's, for every task
SCORED = ("exam", "f1", "rouge")  # L-Eval's automatic metrics; "human" and "LLM" documents are left out
PARTS = ("dev", "held-out", "all")


@dataclass(frozen=True)
class LevalTask:
    """One L-Eval task: its file's name, how its answers are scored (leval_metrics.score) and its
    system prompt."""

    file: str
    scoring: str
    system: str

    @property
    def exam(self) -> bool:
        return self.scoring in ("leval-mc", "leval-mc-multi", "leval-loyalty")


LEVAL_TASKS = {
    "leval-coursera": LevalTask("coursera", "leval-mc-multi", _COURSERA_SYSTEM),
    "leval-quality": LevalTask("quality", "leval-mc", _EXAM_SYSTEM),
    "leval-tpo": LevalTask("tpo", "leval-mc", _EXAM_SYSTEM),
    "leval-scifi": LevalTask("sci_fi", "leval-loyalty", _SCIFI_SYSTEM),
    "leval-legal": LevalTask("legal_contract_qa", "leval-f1", _OPEN_SYSTEM),
    "leval-financial": LevalTask("financial_qa", "leval-f1", _OPEN_SYSTEM),
    "leval-scientific": LevalTask("scientific_qa", "leval-f1", _OPEN_SYSTEM),
    "leval-nq": LevalTask("natural_question", "leval-f1", _OPEN_SYSTEM),
    "leval-multidoc": LevalTask("multidoc_qa", "leval-f1", _OPEN_SYSTEM),
    "leval-meeting": LevalTask("meeting_summ", "leval-rouge", _OPEN_SYSTEM),
    "leval-govreport": LevalTask("gov_report_summ", "leval-rouge", _OPEN_SYSTEM),
}


@dataclass(frozen=True)
class LevalDocument:
    index: int  # among the task's scored documents, in file order
    text: str
    questions: tuple[tuple[str, str], ...]  # (instruction, reference answer)


@dataclass(frozen=True)
class LevalSelection:
    """Which of each task's documents and questions are asked."""

    part: str = "all"
    skip: int = 0  # the part's first this many documents are not asked about (measured before)
    documents: int | None = None  # the first this many documents of the part (after those skipped); None: all
    questions: int | None = None  # the first this many questions of each document; None: all
    shortest_first: bool = False  # the part's documents shortest first (the quick subset's: it reads least)


def leval_folder(named: str | None) -> Path:
    """The folder of L-Eval's data that --leval-data names; refused when none is named."""
    if named is None:
        raise SettingsError("the L-Eval tasks need L-Eval's data", "git clone https://github.com/OpenLMLab/LEval and "
                            "give --leval-data LEval/LEval-data")
    return Path(named)


def task_file(folder: Path, task: LevalTask) -> Path:
    """`<task>.jsonl` in `folder`, or up to two levels below it (LEval-data/Closed-ended-tasks/ …)."""
    for pattern in (f"{task.file}.jsonl", f"*/{task.file}.jsonl", f"*/*/{task.file}.jsonl"):
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    raise SettingsError(
        f"no L-Eval file {task.file}.jsonl in {folder}",
        "give --leval-data the LEval-data folder of `git clone https://github.com/OpenLMLab/LEval`",
    )


@cache
def leval_documents(folder: Path, name: str) -> tuple[LevalDocument, ...]:
    """The scored documents of task `name` in `folder`, in file order."""
    path = task_file(folder, LEVAL_TASKS[name])
    documents = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        for line in filter(str.strip, lines):
            item = json.loads(line)
            if item.get("evaluation") in SCORED:
                pairs = tuple(zip(item["instructions"], item["outputs"]))
                documents.append(LevalDocument(len(documents), item["input"], pairs))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SettingsError(f"cannot read L-Eval file {path}: {error}", "give --leval-data an unchanged copy of LEval-data") from None
    return tuple(documents)


def in_part(documents: tuple[LevalDocument, ...], part: str) -> tuple[LevalDocument, ...]:
    """The dev part (the first half, rounded up), the held-out part (the rest), or all."""
    half = (len(documents) + 1) // 2
    return {"dev": documents[:half], "held-out": documents[half:], "all": documents}[part]


def question_text(task: LevalTask, instruction: str, reference: str) -> str:
    """What kvchat asks: L-Eval's instruction with its baseline's suffix."""
    if task.exam:
        return instruction + _EXAM_SUFFIX
    return f"{instruction} \nAnswer this question with {len(reference.split())} words."


def answer_tokens(task: LevalTask, reference: str) -> int:
    """How many tokens an answer may take: EXAM_MAX_TOKENS, or about 1.5 a reference word."""
    if task.exam:
        return EXAM_MAX_TOKENS
    return min(MAX_NEW_TOKENS, round(1.5 * len(reference.split())) + 16)


def head_to_tokens(text: str, count_tokens: CountTokens, max_tokens: int) -> str:
    """`text`, or as many of its first words as fit in `max_tokens` (L-Eval keeps the head)."""
    if count_tokens(text) <= max_tokens:
        return text
    words = text.split(" ")
    fits, too_many = 0, len(words)
    while too_many - fits > 1:  # the most words that fit, by bisection
        middle = (fits + too_many) // 2
        fits, too_many = (middle, too_many) if count_tokens(" ".join(words[:middle])) <= max_tokens else (fits, middle)
    return " ".join(words[:fits])


def leval_cases(count_tokens: CountTokens, max_document_tokens: int, names: tuple[str, ...], folder: Path,
                selection: LevalSelection) -> list[Case]:
    """The cases of the L-Eval tasks `names`: one per question of the selected documents."""
    cases = []
    for name in names:
        task = LEVAL_TASKS[name]
        documents = in_part(leval_documents(folder, name), selection.part)
        if selection.shortest_first:
            documents = tuple(sorted(documents, key=lambda document: len(document.text)))
        documents = documents[selection.skip:][: selection.documents]
        system_tokens = count_tokens(task.system)
        for document in documents:
            longest_answer = max((answer_tokens(task, reference) for _, reference in document.questions), default=0)
            room = max_document_tokens - system_tokens - longest_answer  # as L-Eval leaves its answers room
            text = head_to_tokens(document.text, count_tokens, room)
            for number, (instruction, reference) in enumerate(document.questions[: selection.questions]):
                cases.append(Case(
                    task=name, document=text, question=question_text(task, instruction, reference), answers=(reference,),
                    meta={"document": document.index, "question": number, "cut": text != document.text},
                    scoring=task.scoring, system=task.system, max_tokens=answer_tokens(task, reference),
                ))
    return cases
