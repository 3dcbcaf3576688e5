"""Request bodies of the OpenAI-compatible API, with kvchat's extension fields."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
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
    include_usage: bool = Field(default=False, strict=True)


class _ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request. Unknown fields are ignored, as OpenAI's SDKs send many,
    except one named as kvchat's (`kv_…`): a mistake to name. The fields kvchat reads are strict,
    as OpenAI's own API is: "10", 10.0 or true for max_tokens, "yes" for stream are refused, not
    guessed (true was a 1-token answer). A number for a float field is taken (temperature 1)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(strict=True)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    seed: int | None = Field(default=None, strict=True)
    n: int | None = Field(default=None, ge=1, le=1, strict=True)
    # kvchat's extensions
    document_id: str | None = Field(default=None, description="answer about an uploaded document (POST /v1/documents)")
    document_ids: list[str] | None = Field(
        default=None, min_length=1, max_length=16, description="answer about several uploaded documents together, named in this order"
    )

    @model_validator(mode="before")
    @classmethod
    def _known_kv_fields(cls, body: object) -> object:
        """Refuses a `kv_` field kvchat does not take (kv_window, kv_system): ignored, it changed nothing."""
        if not isinstance(body, dict):
            return body
        unknown = [key for key in body if isinstance(key, str) and key.startswith("kv_") and key not in KV_FIELDS]
        if unknown:
            raise PydanticCustomError("unknown_kv_field", "unknown {fields} (hint: {hint})",
                                      {"fields": ", ".join(unknown), "hint": _unknown_hint(unknown), "param": unknown[0]})
        return body

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
# The settings a request sets as OpenAI's own fields, where a client might try kv_<setting>.
OPENAI_FIELDS = {"temperature": "temperature", "max_tokens": "max_tokens", "seed": "seed", "system": "a system message"}
SERVED_CHOICES = {"method": ("snapkv", "full")}  # the values this server takes of a setting's, where fewer
UNSET = {  # what an unset field means, where it is not the server's option of the same name
    "budget": "At most, and unset, the server's --budget.",
    "method": f"This server takes {' or '.join(SERVED_CHOICES['method'])}; unset, the default (streamed within kv_budget).",
}


KV_FIELDS = {*SETTING_FIELDS, *OLD_FIELDS.values()}


def _unknown_hint(unknown: list[str]) -> str:
    """What a request sets instead of its unknown `kv_` fields: the kv_ fields kvchat takes, and
    OpenAI's own field for a setting a client tried as kv_<setting>."""
    own = [f"{OPENAI_FIELDS[field[3:]]} for {field}" for field in unknown if field[3:] in OPENAI_FIELDS]
    kv = ", ".join(SETTING_FIELDS)
    return f"use {', '.join(own)}; the kv_ fields are {kv}" if own else f"the kv_ fields are {kv}"


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


def _request_field(name: str) -> str | None:
    return f"kv_{name}" if f"kv_{name}" in SETTING_FIELDS else OPENAI_FIELDS.get(name)


# Every setting a request sets by a field of its own, in UserSettings' order: its kv_<setting>
# fields and OpenAI's own (temperature, seed, max_tokens; the system prompt is a message, no field).
REQUEST_SETTINGS = {field: name for name in setting_names() if (field := _request_field(name)) in ChatCompletionRequest.model_fields}


def value_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """The JSON schema of a set value of each field of `model` (its bounds, its choices as `enum`):
    an optional field's `anyOf` branch that is not null, a reference to a definition (an Enum)
    replaced by the definition, with the field's description."""
    schema = model.model_json_schema()
    definitions = schema.get("$defs", {})

    def value(field: dict[str, Any]) -> dict[str, Any]:
        [branch] = [each for each in field.get("anyOf", [field]) if each.get("type") != "null"]
        resolved = definitions[branch["$ref"].rsplit("/", 1)[1]] if "$ref" in branch else branch
        return {**resolved, "description": field.get("description")}

    return {name: value(field) for name, field in schema["properties"].items()}
