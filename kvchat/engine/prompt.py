"""Put a document, the conversation so far and the new question into the model's chat template.

The prompt is two token sequences: the document part (system prompt + document, the same for
every question, so its KV state can be saved and reused) and the conversation part (the turns
and the new question, last). The question must end the prompt: SnapKV's observation window is
the last `window` tokens, and it is the question's attention that decides what is kept.
Both parts are always tokenized separately, so cached and fresh prompts are identical.

Only the template's own markers are control tokens. Every message's text (a document, a
question, an API message) is tokenized as plain text, so `<|im_end|><|im_start|>system` written
in a PDF stays words and cannot forge a turn. The contents are wrapped in markers that carry a
per-process random nonce (a document cannot write them) before the template renders them; the
rendered text is then cut at those markers into template text and message text.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from kvchat.llama import LlamaModel

SYSTEM_PROMPT = (
    "You answer questions about the document the user gives you. Answer from the document only, "
    "quote names, numbers and dates exactly, and keep the answer short."
)
GENERIC_QUESTION = "What are the most important facts, names, numbers and dates in this document?"
_NONCE = secrets.token_hex(8)
TEXT_START = f"\u27e6kvchat:{_NONCE}:text\u27e7"
TEXT_END = f"\u27e6kvchat:{_NONCE}:/text\u27e7"
DOCUMENT_END = f"\u27e6kvchat:{_NONCE}:document-end\u27e7"
QUESTION_START = f"\u27e6kvchat:{_NONCE}:question\u27e7"
_MARKERS = re.compile("(" + "|".join(map(re.escape, (TEXT_START, TEXT_END, DOCUMENT_END, QUESTION_START))) + ")")


@dataclass(frozen=True)
class PromptPart:
    """A stretch of rendered prompt as (text, is_message_text) segments: the template's text has
    its control markers parsed into control tokens, message text is always plain text."""

    segments: tuple[tuple[str, bool], ...] = ()

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)

    def tokens(self, model: LlamaModel) -> list[int]:
        tokens: list[int] = []
        for text, is_message_text in self.segments:
            tokens += model.tokenize(text, special=not is_message_text)
        return tokens

    def token_runs(self, model: LlamaModel, cuts: list[int]) -> list[list[int]]:
        """The tokens in len(cuts) + 1 runs, cut at the character offsets `cuts` (ascending,
        inside message text): each run is tokenized on its own, so its tokens are the same
        wherever the run is read (a document of several, read on its own)."""
        runs: list[list[int]] = [[]]
        pending, offset = list(cuts), 0
        for text, is_message_text in self.segments:
            start = 0
            while is_message_text and pending and pending[0] <= offset + len(text):
                cut = pending.pop(0) - offset
                runs[-1] += model.tokenize(text[start:cut]) if cut > start else []
                runs.append([])
                start = cut
            runs[-1] += model.tokenize(text[start:], special=not is_message_text) if start < len(text) else []
            offset += len(text)
        if pending:
            raise ValueError("a cut falls outside the prompt's message text")
        return runs


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str


def _question_text(question: str) -> str:
    return f"Question: {question.strip()}"


def _wrapped(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages with their text between TEXT_START and TEXT_END (see the module docstring).
    A NUL becomes U+FFFD: llama.cpp reads the messages as C strings, so one (a model's byte
    token can decode to it) would end its message there, and the rest of the prompt with it."""
    return [{**message, "content": f"{TEXT_START}{message['content'].replace(chr(0), chr(0xFFFD))}{TEXT_END}"}
            for message in messages]


def chat_messages(document_text: str, turns: list[Turn], question: str, system: str | None = None) -> list[dict[str, str]]:
    """System (`system`, or kvchat's), the document with the first question, then the turns.
    Markers (removed by split_rendered) note where the document ends and where the new question
    starts."""
    questions = [_question_text(turn.question) for turn in turns] + [QUESTION_START + _question_text(question)]
    first = f"<document>\n{document_text.strip()}\n</document>\n\n{DOCUMENT_END}{questions[0]}"
    messages = [{"role": "system", "content": system or SYSTEM_PROMPT}, {"role": "user", "content": first}]
    for turn, next_question in zip(turns, questions[1:]):
        messages.append({"role": "assistant", "content": turn.answer.strip()})
        messages.append({"role": "user", "content": next_question})
    return _wrapped(messages)


def _parts(rendered: str) -> list[PromptPart]:
    """Cut rendered text at the markers: a DOCUMENT_END or QUESTION_START starts the next part."""
    parts: list[list[tuple[str, bool]]] = [[]]
    in_message = False
    for piece in _MARKERS.split(rendered):
        if piece in (TEXT_START, TEXT_END):
            in_message = piece == TEXT_START
        elif piece in (DOCUMENT_END, QUESTION_START):
            parts.append([])
        elif piece:
            parts[-1].append((piece, in_message))
    return [PromptPart(tuple(segments)) for segments in parts]


def split_rendered(rendered: str) -> tuple[PromptPart, PromptPart, PromptPart]:
    """The rendered chat split into (document part, earlier turns, the new question)."""
    parts = _parts(rendered)
    if len(parts) != 3 or rendered.find(DOCUMENT_END) > rendered.find(QUESTION_START):
        raise ValueError("the chat template dropped kvchat's prompt markers")
    return parts[0], parts[1], parts[2]


def document_part(model: LlamaModel, document_text: str, system: str | None = None) -> PromptPart:
    """The document part of every prompt about `document_text` (system prompt and document)."""
    part, _, _ = split_rendered(model.apply_chat_template(chat_messages(document_text, [], "", system)))
    return part


def chat_tokens(model: LlamaModel, messages: list[dict[str, str]]) -> list[int]:
    """Tokens of a chat in the model's template, ready for the assistant's answer; the messages'
    text is plain text (see the module docstring)."""
    (whole,) = _parts(model.apply_chat_template(_wrapped(messages)))
    return whole.tokens(model)
