"""The settings a user chooses for an answer, each declared once: its type, its values, its default
and what it means. The CLI's options and their help, the config file's and `KVCHAT_<OPTION>`
defaults, the server's `kv_<setting>` request fields and the chat's settings form are all made
from these fields (docs/layout.md: adding a setting), and a wrong value is refused with one
message (invalid_setting) that each front end words with its own name for the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvchat.errors import SettingsError

DEFAULT_MAX_TOKENS = 512


def _setting(default: Any, description: str, *, served: bool = False, form: str | None = None, **checks: Any) -> Any:
    """A field: `served` makes it a `kv_<name>` field of the server's requests; `form` is its
    label in the chat's settings form (None: not in the form)."""
    return Field(default, description=description, json_schema_extra={"served": served, "form": form}, **checks)


class UserSettings(BaseModel):
    """What a user sets for an answer, as values only: AskSettings is made from them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = _setting(DEFAULT_MAX_TOKENS, "Most tokens per answer.", form="max tokens", ge=1)
    read: Literal["auto", "full", "fast", "retrieval"] = _setting(
        "auto", "How a new document's first question reads it. auto: fast when the model has a draft installed (the "
        "default model: small) and the document is long enough, full otherwise; full: every layer reads the whole "
        "document; fast: a cheap pass (a draft's first layers, or the model's own) chooses the tokens and the whole "
        "model reads only those; retrieval: the passages the question's words choose (BM25) are read alone. "
        "Follow-ups are selected from a whole reading (docs/how-it-works.md: Reading fast).", served=True)
    in_parts: Literal["auto", "on", "off"] = _setting(
        "auto", "Which questions are answered from every part of the document in turn, the answer each part's (a "
        "summary, every clause of a kind, a comparison). auto: those whose wording asks about the whole document "
        "(\"Summarize this agreement\", \"List every …\"); on: every question; off: none, each answered from the "
        "entries its question keeps (docs/how-it-works.md: Questions about the whole document).",
        served=True, form="in parts")
    sources: bool = _setting(True, "Name the passages each answer drew on (from its attention).", served=True)
    system: str | None = _setting(
        None, "The system prompt (default: kvchat's: answer from the document only, quote exactly, keep it short).")


def setting_names(*, served: bool | None = None, in_form: bool | None = None) -> list[str]:
    """The settings' names, in their declared order: those the server's requests carry (`served`),
    those the chat's form shows (`in_form`), or all."""
    names = []
    for name, field in UserSettings.model_fields.items():
        extra = field.json_schema_extra or {}
        if served is not None and extra["served"] != served:  # type: ignore[index]
            continue
        if in_form is not None and (extra["form"] is not None) != in_form:  # type: ignore[index]
            continue
        names.append(name)
    return names


def form_label(name: str) -> str:
    return UserSettings.model_fields[name].json_schema_extra["form"]  # type: ignore[index,return-value]


def choices(name: str) -> tuple[str, ...]:
    """The values a setting takes, for one of a few (a Literal); () for the others."""
    annotation = UserSettings.model_fields[name].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def user_settings(values: Mapping[str, Any], base: UserSettings | None = None) -> UserSettings:
    """`base` (kvchat's defaults) with `values` set; a wrong value raises invalid_setting's error."""
    try:
        return UserSettings.model_validate({**(base or UserSettings()).model_dump(), **values})
    except ValidationError as error:
        raise invalid_setting(error.errors()[0]) from None


def invalid_setting(error: Mapping[str, Any], name: str | None = None) -> SettingsError:
    """The one message for a wrong value of a setting, from a pydantic error (the CLI's, the
    server's request validation's); `name`: the setting, when the error's location is a front
    end's field for it."""
    name = name or str(error["loc"][-1])
    value, kinds = error.get("input"), choices(name)
    if kinds:
        return SettingsError(f"unknown `{name}` {value!r}", f"use {_either(kinds)}")
    field = UserSettings.model_fields[name]
    if field.annotation is bool:
        return SettingsError(f"`{name}` is true or false, not {value!r}", f"{str(field.default).lower()} is the default")
    return SettingsError(f"`{name}` {_lowered(error['msg'])}, not {value!r}", f"{field.default!r} is the default")


def _either(values: tuple[str, ...]) -> str:
    return ", ".join(values[:-1]) + f" or {values[-1]}"


def _lowered(message: str) -> str:
    """pydantic's "Input should be greater than or equal to 1" as "should be greater than or equal to 1"."""
    return message.removeprefix("Input ").removeprefix("Value ")
