"""L-Eval's automatic metrics, as its Evaluation/auto_eval.py (cd34b05) computes them, each 0..1
(L-Eval reports them x100):

- multiple choice (QuALITY, TOEFL, Coursera): the letters are read from the answer as L-Eval reads
  them (for single-answer tasks the first capital A-D anywhere in it, so an answer should start
  with its letter); the same letters score 1, and for Coursera's several-letter answers other
  letters that are all right ones (a subset, as L-Eval's set test has it) score 0.25;
- SFiction's loyalty: the first word that holds "true" or "false" against the reference's;
- token F1 after SQuAD's normalization (lower case, no punctuation or articles);
- ROUGE-L F-measure from Google's rouge_score, without stemming.
"""

from __future__ import annotations

import importlib.util
import re
import string
from collections import Counter
from functools import cache

from kvchat.errors import SettingsError

_LETTERS = "ABCD"
_OPTION_MARK = re.compile(r"\s*[A-Z](?=[\s.)])")  # a capital letter that stands alone: "A.", "(B)", "C "
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def mc_answer(answer: str, several: bool) -> str:
    """The letters an answer chose, as L-Eval reads them: "None" for an empty answer; for a task
    with one right option the first capital A-D in it; else (Coursera) a leading run of letters
    ("ACD"), or the capitals that stand alone before any "Question" ("A. … C. …" is "AC"), or the
    first run of letters anywhere, or "A" (a guess)."""
    if not answer.strip():
        return "None"
    if answer in _LETTERS:  # "", "B", "BC", "ABCD": a run of the letters in order
        return answer
    if not several:
        first = next((char for char in answer if char in _LETTERS), None)
        if first is not None:
            return first
    leading = ""
    for char in answer:
        if char not in _LETTERS:
            break
        leading += char
    if len(leading) > 1:
        return "".join(sorted(set(leading)))
    rest = answer[len(leading):].split("Question")[0]
    marked = leading + "".join(mark.strip() for mark in _OPTION_MARK.findall(rest))
    chosen = "".join(sorted(set(char for char in marked if char in _LETTERS)))
    if not chosen:
        run = re.search(f"[{_LETTERS}]+", rest)
        chosen = run.group() if run else ""
    return chosen or "A"


def mc_reference(reference: str) -> str:
    """The right letters of a reference ("(B) Their subconscious …" is "B")."""
    first = reference.split()[0] if reference.split() else ""
    return "".join(char for char in first if char in _LETTERS) or "A"


def mc_score(answer: str, reference: str, several: bool) -> float:
    """1 for the right letters; 0.25 for some of them and no wrong one; else 0."""
    chosen, right = _strip(mc_answer(answer, several)), _strip(mc_reference(reference))
    if chosen == right:
        return 1.0
    return 0.25 if set(chosen) <= set(right) else 0.0


def _strip(text: str) -> str:
    """L-Eval's exact-match normalization: no punctuation or articles, single spaces (case kept)."""
    return " ".join(_ARTICLES.sub(" ", text.translate(_PUNCTUATION)).split())


def judgement(text: str) -> str:
    """"true" or "false": the first word holding either (before any "[fact:"), else "<error>"."""
    for word in text.lower().split("[fact:")[0].split():
        if "true" in word:
            return "true"
        if "false" in word:
            return "false"
    return "<error>"


def loyalty_score(answer: str, reference: str) -> float:
    return float(judgement(answer) == judgement(reference))


def _words(text: str) -> list[str]:
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split()


def f1_score(answer: str, reference: str) -> float:
    """SQuAD's token F1 of the answer against the reference."""
    answer_words, reference_words = _words(answer), _words(reference)
    same = sum((Counter(answer_words) & Counter(reference_words)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(answer_words), same / len(reference_words)
    return 2 * precision * recall / (precision + recall)


def require_rouge() -> None:
    """Refuse, with the install command, when rouge_score (the `bench` extra) is not installed."""
    if importlib.util.find_spec("rouge_score") is None:
        raise SettingsError("scoring L-Eval's summaries needs rouge_score", 'pip install "kvchat[bench]"')


@cache
def _rouge_l():  # type: ignore[no-untyped-def]
    require_rouge()
    from rouge_score import rouge_scorer  # the bench extra's: imported when a summary is scored

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(answer: str, reference: str) -> float:
    """ROUGE-L F-measure of the answer against the reference (rouge_score, no stemming)."""
    return float(_rouge_l().score(reference, answer)["rougeL"].fmeasure)


def leval_score(scoring: str, answer: str, reference: str) -> float:
    """The answer's score by one of the L-Eval scorings of leval.LEVAL_TASKS."""
    if scoring in ("leval-mc", "leval-mc-multi"):
        return mc_score(answer, reference, several=scoring == "leval-mc-multi")
    if scoring == "leval-loyalty":
        return loyalty_score(answer, reference)
    if scoring == "leval-f1":
        return f1_score(answer, reference)
    if scoring == "leval-rouge":
        return rouge_l(answer, reference)
    raise ValueError(f"no L-Eval scoring {scoring!r}")
