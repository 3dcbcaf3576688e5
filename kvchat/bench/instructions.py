"""Candidate instructions for the system prompt, measured against kvchat's own
(engine/prompt.SYSTEM_PROMPT: answer from the document only, quote names, numbers and dates
exactly, keep the answer short) with `kvchat bench --variant system=NAME`: each names one habit
a document answerer can be told to have. `kvchat` is kvchat's own, for the tasks that bring a
system prompt of their own (L-Eval's), which a variant replaces."""

from __future__ import annotations

from kvchat.engine import SYSTEM_PROMPT

_ROLE = "You answer questions about the document the user gives you."

INSTRUCTIONS = {
    "kvchat": SYSTEM_PROMPT,
    "role": _ROLE,  # the role alone: what the model does untold
    "quote": f"{_ROLE} First quote the sentence of the document that answers the question, then give the answer in a few words.",
    "only": f"{_ROLE} Answer only from the document, never from what you know besides it.",
    "unknown": f"{_ROLE} Answer from the document; if it does not say, answer that the document does not say.",
}
