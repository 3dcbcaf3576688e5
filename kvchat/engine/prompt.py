"""Put a document and a question into the model's chat template, question last.

The question must end the prompt: SnapKV's observation window is the last `window` tokens, and
it is the question's attention that decides which parts of the document are kept.
"""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You answer questions about the document the user gives you. Answer from the document only, "
    "quote names, numbers and dates exactly, and keep the answer short."
)


def document_messages(document_text: str, question: str) -> list[dict[str, str]]:
    user = f"<document>\n{document_text.strip()}\n</document>\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
