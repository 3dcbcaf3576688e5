"""Put a document, the conversation so far and the new question into the model's chat template.

The prompt is two token sequences: the document part (system prompt + document, the same for
every question, so its KV state can be saved and reused) and the conversation part (the turns
and the new question, last). The question must end the prompt: SnapKV's observation window is
the last `window` tokens, and it is the question's attention that decides what is kept.
Both parts are always tokenized separately, so cached and fresh prompts are identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You answer questions about the document the user gives you. Answer from the document only, "
    "quote names, numbers and dates exactly, and keep the answer short."
)
GENERIC_QUESTION = "What are the most important facts, names, numbers and dates in this document?"
DOCUMENT_END = "\u27e6kvchat:document-end\u27e7"
QUESTION_START = "\u27e6kvchat:question\u27e7"


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str


def _question_text(question: str) -> str:
    return f"Question: {question.strip()}"


def chat_messages(document_text: str, turns: list[Turn], question: str) -> list[dict[str, str]]:
    """System, the document with the first question, then the turns. Markers (removed by
    split_rendered) note where the document ends and where the new question starts."""
    questions = [_question_text(turn.question) for turn in turns] + [QUESTION_START + _question_text(question)]
    first = f"<document>\n{document_text.strip()}\n</document>\n\n{DOCUMENT_END}{questions[0]}"
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": first}]
    for turn, next_question in zip(turns, questions[1:]):
        messages.append({"role": "assistant", "content": turn.answer.strip()})
        messages.append({"role": "user", "content": next_question})
    return messages


def split_rendered(rendered: str) -> tuple[str, str, str]:
    """The rendered chat split into (document part, earlier turns, the new question)."""
    document_part, end_marker, conversation = rendered.partition(DOCUMENT_END)
    earlier, start_marker, question_part = conversation.partition(QUESTION_START)
    if not (end_marker and start_marker):
        raise ValueError("the chat template dropped kvchat's prompt markers")
    return document_part, earlier, question_part


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
