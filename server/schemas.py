"""Request bodies of the OpenAI-compatible API, with kvchat's extension fields."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from kvchat.policy import MIN_BUDGET

# JSON may escape half of a UTF-16 pair alone ("\ud800"): Python decodes it to a lone surrogate,
# which is no text (nothing can encode it, not the tokenizer, not a response); refused as the
# field that holds it, rather than a 500 wherever it is first encoded.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(text: str) -> str:
    """`text`, or a validation error (400 naming the field) when it holds a lone surrogate."""
    if LONE_SURROGATE.search(text):
        raise PydanticCustomError("lone_surrogate", "a lone surrogate (\\ud800 to \\udfff without its pair) is not text; "
                                  "send the character itself or its whole UTF-16 pair")
    return text


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    @field_validator("content")
    @classmethod
    def _unicode(cls, content: str | list[TextPart]) -> str | list[TextPart]:
        unicode_text(content if isinstance(content, str) else "".join(part.text for part in content))
        return content


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request; unknown fields are ignored, as OpenAI's SDKs expect."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    # kvchat's extensions
    document_id: str | None = Field(default=None, description="answer about an uploaded document (POST /v1/documents)")
    document_ids: list[str] | None = Field(
        default=None, min_length=1, max_length=16, description="answer about several uploaded documents together, named in this order"
    )
    # kvchat's own fields are strict: "512" or true for kv_budget, "false" for kv_sources is a mistake to name, not to guess
    kv_budget: int | None = Field(  # its range is checked with the server's limit (service.py), in one message
        default=None, strict=True, description=f"KV entries kept for the prompt: from {MIN_BUDGET} to the server's budget"
    )
    kv_method: Literal["snapkv", "full"] | None = Field(
        default=None, description="snapkv prunes to kv_budget; full keeps the prompt whole. Unset: snapkv, or a document "
        "longer than the model's context read streamed within kv_budget")
    kv_read: Literal["auto", "full", "fast", "retrieval"] | None = Field(
        default=None, description="fast: a new document's first question is answered from a fast reading (a draft "
        "model's or the model's first layers choose the tokens, the whole model reads only those); retrieval: the "
        "passages the question's words choose (BM25) are read alone for it; auto: fast when "
        "the server has a draft and the prompt is long enough; full: every layer reads it all; unset: the server's --read")
    kv_whole: Literal["auto", "on", "off"] | None = Field(
        default=None, description="about a document: answer from all of it, in parts, each asked in turn, the answer "
        "each part's under its heading: on for every question, auto for those whose wording asks about the whole (a summary, every clause of a "
        "kind), off for none; unset: the server's --whole")
    kv_sources: bool = Field(default=True, strict=True, description="about a document: name the passages the answer drew on "
                             "(the kv block's sources)")

    @field_validator("model", "document_id")
    @classmethod
    def _unicode(cls, text: str | None) -> str | None:
        return text if text is None else unicode_text(text)

    @field_validator("document_ids")
    @classmethod
    def _each_unicode(cls, ids: list[str] | None) -> list[str] | None:
        return ids if ids is None else [unicode_text(each) for each in ids]
