"""Whether a question asks about the whole document (a summary of it, every clause of a kind, a
comparison of documents) rather than looks something up, told from its wording.

Such a question is answered from all of the document, in parts (in_parts.py); a lookup from the
entries its attention keeps. The rules ask for the document itself as the object: "Summarize
this agreement" is about the whole, "Summarize the confidentiality clause" or "Summarize the
discussion on latency" is not (its attention finds the passage). They were written on a dev set
of questions and measured on held-out ones (docs/bench/design-history.md, "Which questions
are answered in parts"); a user who knows better says so (the `in_parts` setting: on or off).
"""

from __future__ import annotations

import re


# The document itself, as a question names it: "this agreement", "the whole meeting", "the two contracts"
_DOCUMENT = (r"(this|the|these|both|two)\s+(\w+\s+)?(agreement|contract|document|report|meeting|paper|book|text|file|article"
             r"|chapter|transcript|call|lecture|story|pdf|documents|contracts|agreements)s?")
_WHOLE_QUESTION = [
    re.compile(rf"\b(summar(y|ies|i[sz]e)|overview|gist|synopsis|outline|recap)\s+(of\s+|on\s+)?{_DOCUMENT}\b", re.I),
    re.compile(r"^\s*(please\s+)?(summari[sz]e|give (me )?(a |an )?(short |brief )?(summary|overview))\s*(it|this)?\s*[.!?]?\s*$", re.I),
    re.compile(r"\btl;?dr\b", re.I),
    re.compile(r"\bwhat\s+(is|'s)\s+(this|the)\s+(\w+\s+)?about\b", re.I),
    re.compile(r"\b(main|key|important)\s+(points|terms|ideas|findings|takeaways|provisions|obligations)\b", re.I),
    re.compile(r"\b(list|quote|name|find|show)\b[^?.]*\b(all|every|each)\b", re.I),  # list every X
    re.compile(r"\b(all|every)\s+(of\s+)?(the\s+)?\w*\s*(ways|clauses|obligations|terms|dates|deadlines|provisions|sections"
               r"|risks|parties|payments|fees|conditions|rights|duties|events|mentions)\b", re.I),
    re.compile(r"\b(compare|comparison|differ|differences?|contrast)\b.*\b(two|both|these|the)\s+(\w+\s+)?"
               r"(agreements|contracts|documents|reports|papers|versions|drafts)\b", re.I),
]


def about_whole(question: str) -> bool:
    """Whether `question` asks about the whole document, by its wording."""
    return any(rule.search(question) for rule in _WHOLE_QUESTION)


def answers_in_parts(in_parts: str, question: str) -> bool:
    """Whether `question` is answered from every part of the document (in_parts.py), as the
    `in_parts` setting says: always (on), never (off), or by its wording (auto)."""
    return in_parts == "on" or (in_parts == "auto" and about_whole(question))
