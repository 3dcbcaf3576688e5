"""Synthetic long-context tasks in RULER's style, built from the shipped essays and word lists.

Every case is a document, a question and the gold strings; scoring is RULER's case-insensitive
substring match (the real-contract task, `kvchat.bench.cuad`, uses a normalized match instead).
Lengths are hit with the tested model's own tokenizer (`count_tokens`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from kvchat.bench.answers import answer_matches
from kvchat.bench.clauses import clauses_quoted
from kvchat.bench.leval_metrics import leval_score

CountTokens = Callable[[str], int]
SENTENCE_END = re.compile(r"[.!?]\s+")


@dataclass(frozen=True)
class Case:
    """`scoring` "ruler": every answer string is wanted (see `score`); "normalized": `answers` are
    alternatives and `refuse` strings make an answer wrong (see `kvchat.bench.answers`); "leval-…":
    L-Eval's metric against the one reference (`kvchat.bench.leval_metrics`); "clauses": the share
    of the `answers` (clauses) the answer quotes (`kvchat.bench.clauses`). `system` and
    `max_tokens`, when set, are the task's own (L-Eval's prompt, its answers' length)."""

    task: str
    document: str
    question: str
    answers: tuple[str, ...]
    meta: dict[str, object] = field(default_factory=dict)
    scoring: str = "ruler"
    refuse: tuple[str, ...] = ()
    system: str | None = None
    max_tokens: int | None = None


def score(answer: str, golds: tuple[str, ...]) -> float:
    """Fraction of gold strings found in the answer, case-insensitively (RULER's 'all' metric)."""
    if not golds:
        return 0.0
    lowered = answer.lower()
    return sum(gold.lower() in lowered for gold in golds) / len(golds)


def case_score(case: Case, answer: str) -> float:
    """The answer's score on this case, 0..1, by the case's own scoring."""
    if case.scoring == "normalized":
        return float(answer_matches(answer, case.answers, case.refuse))
    if case.scoring.startswith("leval-"):
        return leval_score(case.scoring, answer, case.answers[0])
    if case.scoring == "clauses":
        return clauses_quoted(answer, case.answers)
    return score(answer, case.answers)


@cache
def essay_text() -> str:
    folder = resources.files("kvchat.bench") / "data" / "essays"
    names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".txt"))
    return "\n\n".join((folder / name).read_text(encoding="utf-8").strip() for name in names)


@cache
def _word_list(name: str) -> tuple[str, ...]:
    path = resources.files("kvchat.bench") / "data" / "wonderwords" / name
    return tuple(word for word in path.read_text(encoding="utf-8").split() if word.isalpha())


def random_key(rng: random.Random) -> str:
    """An adjective-noun key, as RULER makes them."""
    return f"{rng.choice(_word_list('adjectivelist.txt'))}-{rng.choice(_word_list('nounlist.txt'))}"


def haystack(count_tokens: CountTokens, target_tokens: int) -> str:
    """The longest prefix of the essays (cut at a sentence end) that is at most `target_tokens`."""
    text = essay_text()
    low, high = 0, len(text)
    while high - low > 64:
        middle = (low + high) // 2
        if count_tokens(text[:middle]) <= target_tokens:
            low = middle
        else:
            high = middle
    cut = _sentence_end_before(text, low)
    return text[: cut if cut > 0 else low]


def _sentence_end_before(text: str, offset: int) -> int:
    """The index just after the last sentence end ('.', '!' or '?' then white space) before offset."""
    window_start = max(0, offset - 2000)
    ends = [match.end() for match in SENTENCE_END.finditer(text, window_start, offset)]
    return ends[-1] if ends else 0


def insert_at_depth(text: str, sentence: str, depth: float) -> str:
    """Insert `sentence` at the sentence boundary just before `depth` (0..1) of the text."""
    split = _sentence_end_before(text, int(len(text) * depth))
    return text[:split] + sentence + " " + text[split:]


def needle_case(count_tokens: CountTokens, length: int, depth: float, seed: int) -> Case:
    """One key-to-7-digit-number needle in the essays at `depth` (RULER niah_single_2)."""
    rng = random.Random(seed)
    key, value = random_key(rng), str(rng.randint(1_000_000, 9_999_999))
    needle = f"One of the special magic numbers for {key} is: {value}."
    filler = haystack(count_tokens, length - count_tokens(needle) - 40)
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    return Case("needle", insert_at_depth(filler, needle, depth), question, (value,),
                {"length": length, "depth": depth, "seed": seed})


MULTIKEY_TASKS = {"multikey": 8, "multikey16": 16}  # task name: its number of keys


def multikey_case(count_tokens: CountTokens, length: int, n_keys: int, seed: int) -> Case:
    """`n_keys` key-to-number needles spread through the essays; one of them is asked. Its task is
    named after the keys (MULTIKEY_TASKS)."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n_keys:
        key = random_key(rng)
        if key not in dict(pairs):
            pairs.append((key, str(rng.randint(1_000_000, 9_999_999))))
    needles = [f"One of the special magic numbers for {k} is: {v}." for k, v in pairs]
    filler = haystack(count_tokens, length - sum(map(count_tokens, needles)) - 40)
    depths = sorted(rng.uniform(0.05, 0.95) for _ in needles)
    for needle, depth in reversed(list(zip(needles, depths))):
        filler = insert_at_depth(filler, needle, depth)
    asked = rng.randrange(n_keys)
    key, value = pairs[asked]
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    task = next((name for name, keys in MULTIKEY_TASKS.items() if keys == n_keys), f"multikey{n_keys}")
    return Case(task, filler, question, (value,),
                {"length": length, "keys": n_keys, "asked_depth": depths[asked], "seed": seed})


@dataclass(frozen=True)
class MultiTurnCase:
    """Several facts far apart in one document, asked about one after another."""

    document: str
    questions: tuple[str, ...]
    answers: tuple[tuple[str, ...], ...]
    meta: dict[str, object] = field(default_factory=dict)


def multi_turn_case(count_tokens: CountTokens, length: int, depths: tuple[float, ...], seed: int) -> MultiTurnCase:
    """One key-to-number fact per depth; one question per fact, asked in depth order."""
    rng = random.Random(seed)
    facts = [(random_key(rng), str(rng.randint(1_000_000, 9_999_999))) for _ in depths]
    sentences = [f"One of the special magic numbers for {key} is: {value}." for key, value in facts]
    text = haystack(count_tokens, length - sum(map(count_tokens, sentences)) - 40)
    for sentence, depth in sorted(zip(sentences, depths), key=lambda pair: -pair[1]):
        text = insert_at_depth(text, sentence, depth)
    questions = tuple(f"What is the special magic number for {key} mentioned in the provided text?" for key, _ in facts)
    return MultiTurnCase(text, questions, tuple((value,) for _, value in facts),
                         {"length": length, "depths": depths, "seed": seed})


def variable_tracking_case(count_tokens: CountTokens, length: int, seed: int, hops: int = 4) -> Case:
    """RULER's variable tracking: a chain of assignments through 5 variables, spread in the essays."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10_000, 99_999))
    statements = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, hops + 1)]
    text = haystack(count_tokens, length - sum(map(count_tokens, statements)) - 60)
    depths = sorted(rng.uniform(0.05, 0.95) for _ in statements)
    for statement, depth in reversed(list(zip(statements, depths))):
        text = insert_at_depth(text, statement, depth)
    question = (f"Which variables are assigned the value {value}, directly or through other variables? "
                "List all of their names.")
    return Case("vt", text, question, tuple(names), {"length": length, "seed": seed})
