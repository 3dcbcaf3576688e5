"""Request bodies of the OpenAI-compatible API, with kvchat's extension fields."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from kvchat.engine import UserSettings, choices, setting_names, value_type

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


class _ChatCompletionRequest(BaseModel):
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
    @field_validator("model", "document_id")
    @classmethod
    def _unicode(cls, text: str | None) -> str | None:
        return text if text is None else unicode_text(text)

    @field_validator("document_ids")
    @classmethod
    def _each_unicode(cls, ids: list[str] | None) -> list[str] | None:
        return ids if ids is None else [unicode_text(each) for each in ids]


# The user's settings a request sets, as `kv_<setting>` fields made from their declarations; unset
# (None): the server's default (kvchat serve's option). Strict: "512" or true for kv_budget, "false"
# for kv_sources is a mistake to name, not to guess (a Literal is strict already).
SETTING_FIELDS = {f"kv_{name}": name for name in setting_names(served=True)}
OLD_FIELDS = {"in_parts": "kv_whole"}  # deprecated names a request may still use
SERVED_CHOICES = {"method": ("snapkv", "full")}  # the values this server takes of a setting's, where fewer
UNSET = {  # what an unset field means, where it is not the server's option of the same name
    "budget": "At most, and unset, the server's --budget.",
    "method": f"This server takes {' or '.join(SERVED_CHOICES['method'])}; unset, the default (streamed within kv_budget).",
}


def _setting_field(name: str) -> tuple[object, object]:
    field = UserSettings.model_fields[name]
    names = [f"kv_{name}", *([OLD_FIELDS[name]] if name in OLD_FIELDS else [])]
    kinds = SERVED_CHOICES.get(name)
    value = Literal[kinds] if kinds else Annotated[(value_type(name), *field.metadata)] if field.metadata else value_type(name)
    unset = UNSET.get(name, f"Unset: the server's --{name.replace('_', '-')}.")
    return value | None, Field(  # type: ignore[operator]
        default=None, strict=None if choices(name) else True, validation_alias=AliasChoices(*names) if len(names) > 1 else None,
        description=f"{field.description} {unset}")


ChatCompletionRequest = create_model(  # type: ignore[call-overload]
    "ChatCompletionRequest", __base__=_ChatCompletionRequest, __doc__=_ChatCompletionRequest.__doc__,
    **{field_name: _setting_field(name) for field_name, name in SETTING_FIELDS.items()},
)
