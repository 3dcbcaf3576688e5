"""Whether an answer quotes a clause: the `cuad-lists` task's score (lists.py)."""

from __future__ import annotations

import re

# Words of a clause in a row that make an answer's quote of it: six took clauses that open alike
# for one another ("Todos shall have the right to have an inspection …" for "Todos shall have the
# right to conduct periodic on-site inspections …"); ten did not, on the dev contract's answers.
QUOTED_WORDS = 10
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def quotes(answer: str, clause: str) -> bool:
    """Whether `answer` quotes `clause`: QUOTED_WORDS of its words in a row (all of them, if the
    clause is shorter), within one of its fragments (CUAD marks the text it left out of a clause
    with <omitted>; a fragment shorter than that run cannot be quoted alone)."""
    fragments = [_words(fragment) for fragment in clause.split("<omitted>")]
    run = min(QUOTED_WORDS, sum(len(words) for words in fragments))
    said = f" {' '.join(_words(answer))} "
    return any(f" {' '.join(words[i:i + run])} " in said for words in fragments for i in range(len(words) - run + 1))


def clauses_quoted(answer: str, clauses: tuple[str, ...]) -> float:
    """The share of `clauses` the answer quotes."""
    return sum(quotes(answer, clause) for clause in clauses) / len(clauses) if clauses else 0.0
