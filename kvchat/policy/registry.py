"""Every method by name: what the CLI, the TUI, the bench and the server offer and build."""

from __future__ import annotations

from dataclasses import fields

from kvchat.errors import SettingsError
from kvchat.policy.full import Full
from kvchat.policy.method import Method
from kvchat.policy.snapkv import SnapKV
from kvchat.policy.snapstream import SnapStream
from kvchat.policy.streaming_llm import StreamingLLM

METHODS: dict[str, type[Method]] = {method.name: method for method in (Full, SnapKV, StreamingLLM, SnapStream)}


def method_named(name: str, **options: object) -> Method:
    """The method called `name` with `options`; an option it does not have is an error that
    names those it has (a kernel means nothing to streamingllm)."""
    return method_carrying(name, {}, **options)


def method_carrying(name: str, carried: dict[str, object], **options: object) -> Method:
    """The method called `name` with `options` (each one it must have) and, of `carried`, those
    it has: settings brought from elsewhere, not named for this method by the user (another
    method's when a long document is read streamed, a settings screen's fields, a server's
    default for every method)."""
    method = METHODS.get(name)
    if method is None:
        raise SettingsError(f"unknown method {name!r}", f"use one of: {', '.join(METHODS)}")
    accepted = [field.name for field in fields(method)]
    if unknown := [key for key in options if key not in accepted]:
        raise SettingsError(f"{name} has no option {', '.join(f'`{key}`' for key in unknown)}", f"{name} takes {', '.join(accepted)}")
    return method(**{**{key: value for key, value in carried.items() if key in accepted}, **options})  # type: ignore[arg-type]


def methods_help() -> str:
    """`snapkv (prune after reading), full (keep everything), …` for a --method help text."""
    return ", ".join(f"{name} ({method.summary})" for name, method in METHODS.items())


def method_options(method: Method) -> dict[str, object]:
    """The settings of `method` by name, to build another method with the same ones."""
    return {field.name: getattr(method, field.name) for field in fields(method)}
