"""The settings a user chooses for an answer and the engine that gives it (its KV layout, its GPU
layers, its draft), each declared once: its type, its values, its default and what it means. The CLI's options and their help, the config file's and `KVCHAT_<OPTION>`
defaults, the server's `kv_<setting>` request fields and the chat's settings form are all made
from these fields (docs/layout.md: adding a setting), and a wrong value is refused with one
message (invalid_setting) that each front end words with its own name for the setting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from kvchat.errors import SettingsError
from kvchat.llama import CACHE_TYPES, available_cpus
from kvchat.llama.shape_limits import SHAPE_LIMITS
from kvchat.policy import DEFAULT_BUDGET, DEFAULT_WINDOW, METHODS, MIN_BUDGET, SPAN_MODES, HeadReduction, PoolMode, SnapKV, methods_help

METHOD_NAMES = tuple(METHODS)
HEAD_REDUCTIONS = tuple(reduction.value for reduction in HeadReduction)
SELECTION_NAMES = ("question", "document", "reuse")  # selections/registry.py's, by name (the selections import these settings)

DEFAULT_MAX_TOKENS = 512
# Where a command's --help lists a setting: with the answer settings, the advanced ones (how the
# kept entries are chosen), or (None) with the command's other options.
ANSWER, ADVANCED = "answer", "advanced"
# Threads for each CPU kvchat may use, at most: more only wait on each other, and far more crash
# llama.cpp (docs/cli.md, "Threads").
MAX_THREADS_PER_CPU = 4
# The most tokens of a context, a batch, a budget or an answer: the largest context a model may
# declare (shape_limits.py), so that none of them is ever larger than a context. llama.cpp takes
# these as 32-bit numbers: --n-batch 2147483647 crashed in llama_batch_init, 4294967808 was read
# as 512, and a server's context of 8 sequences of a 2^31 budget wrapped to a few thousand cells.
MOST_TOKENS = SHAPE_LIMITS["context_length"]
# llama.cpp's n_gpu_layers is a 32-bit int (2^32 + 512 was read as 512, 2^63 as 0: none on the GPU);
# any count above the model's layers puts them all there.
MOST_GPU_LAYERS = 2**31 - 1
# llama.cpp's seed is 32 bits (a larger one was cut to its low bits) and 2^32 - 1 means a random one.
MOST_SEED = 2**32 - 2
SNAPKV = SnapKV()  # the defaults of its options, which snapstream shares


def _setting(default: Any, description: str, *, served: bool = False, form: str | None = None, panel: str | None = ANSWER,
             **checks: Any) -> Any:
    """A field: `served` makes it a `kv_<name>` field of the server's requests; `form` is its
    label in the chat's settings form (None: not in the form); `panel` its place in --help."""
    extra = {"served": served, "form": form, "panel": panel}
    return Field(default, description=description, json_schema_extra=extra, **checks)  # type: ignore[arg-type]


def _odd(number: int | None) -> int | None:
    if number is not None and number % 2 == 0:
        raise PydanticCustomError("odd", "should be an odd number")
    return number


def _not_blank(text: str | None) -> str | None:
    if text is not None and not text.strip():
        raise PydanticCustomError("blank", "should hold some text")
    return text


def _within_cpus(threads: int | None) -> int | None:
    """Refuses a thread count llama.cpp would crash on or crawl with (MAX_THREADS_PER_CPU)."""
    cpus = available_cpus()
    if threads is not None and threads > MAX_THREADS_PER_CPU * cpus:
        raise PydanticCustomError("too_many_threads", "should be at most {most} ({per} for each of the {cpus} CPUs kvchat may use)",
                                  {"most": MAX_THREADS_PER_CPU * cpus, "per": MAX_THREADS_PER_CPU, "cpus": cpus})
    return threads


class UserSettings(BaseModel):
    """What a user sets for an answer, as values only: AskSettings is made from them (ask_settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget: int = _setting(DEFAULT_BUDGET, "KV entries kept for the prompt, observation window included.", served=True,
                           form="KV budget", panel=None, ge=MIN_BUDGET, le=MOST_TOKENS)
    window: int | None = _setting(
        None, f"Observation window: the question's last tokens whose attention votes (default {DEFAULT_WINDOW}, fewer where "
        f"the budget has no room for them).", form="window", panel=ADVANCED, ge=1)
    kernel: Annotated[int | None, AfterValidator(_odd)] = _setting(
        None, f"snapkv, snapstream: pooling kernel (odd) that keeps neighbours of chosen tokens (default {SNAPKV.kernel}).",
        form="pooling kernel", panel=ADVANCED, ge=1)
    pool: PoolMode | None = _setting(
        None, f"snapkv, snapstream: pooling, max or avg (default {SNAPKV.pool}).", form="pooling", panel=ADVANCED)
    heads: Literal[HEAD_REDUCTIONS] | None = _setting(  # type: ignore[valid-type]
        None, "snapkv, snapstream: how the heads choose: sum (one ranking of their votes, the default), normalized, "
        "topk-count, max, or per-head (each layer and KV head keeps its own tokens, in the same number of cells).",
        panel=ADVANCED)
    spans: Literal[SPAN_MODES] | None = _setting(  # type: ignore[valid-type]
        None, "snapkv, snapstream: keep whole spans once one of their tokens is chosen: words (numbers and words), "
        f"sentences, chunks (32 tokens), or none (default {SNAPKV.spans}).", panel=ADVANCED)
    method: Literal[METHOD_NAMES] | None = _setting(  # type: ignore[valid-type]
        None, f"{methods_help()}. Default: {SNAPKV.name}, or snapstream for a document longer than the model's context.",
        served=True, form="method", panel=ADVANCED)
    chunk: int = _setting(512, "snapstream: tokens read between evictions.", panel=ADVANCED, ge=1)
    recent: int = _setting(64, "snapstream: most recent tokens always kept while reading.", panel=ADVANCED, ge=1)
    select: Literal[SELECTION_NAMES] = _setting(  # type: ignore[valid-type]
        "question", "How a conversation's questions choose what they keep: question (each from the whole document), "
        "document (one query-agnostic choice per document) or reuse (the first question's choice, for the follow-ups).",
        panel=ADVANCED)
    temperature: float = _setting(0.0, "0 = greedy (deterministic).", form="temperature", panel=None, ge=0)
    seed: int | None = _setting(None, "Sampling seed (with --temperature > 0).", panel=None, ge=0, le=MOST_SEED)
    threads: Annotated[int | None, AfterValidator(_within_cpus)] = _setting(
        None, "CPU threads for reading and decoding (default: every CPU kvchat may use).", panel=None, ge=1)
    gpu_layers: int = _setting(0, "Layers to offload to the GPU (a CUDA or Metal build; see docs/gpu.md).", panel=None,
                               ge=0, le=MOST_GPU_LAYERS)
    flash_attn: Literal["auto", "on", "off"] = _setting(
        "auto", "on, off, or auto (on with --gpu-layers); on: scores from queries and keys.", panel=None)
    cache_type_k: Literal[CACHE_TYPES] = _setting("f16", "KV cache type of K: f16 or q8_0.", panel=None)  # type: ignore[valid-type]
    cache_type_v: Literal[CACHE_TYPES] = _setting(  # type: ignore[valid-type]
        "f16", "KV cache type of V: f16 or q8_0 (q8_0 needs flash attention).", panel=None)
    n_ctx: int | None = _setting(None, "Context size (default: fits the prompt + max tokens).", panel=None, ge=1, le=MOST_TOKENS)
    n_batch: int = _setting(512, "Tokens read per step: a reading's chunk, and the largest --window.", panel=None,
                            ge=1, le=MOST_TOKENS)
    cache: bool = _setting(True, "Save each document's reading and reuse it next time.", panel=None)
    draft: str | None = _setting(
        None, "A smaller model with the same vocabulary (registry name or GGUF path) that does the cheap pass of a "
        "fast reading: its attention chooses the tokens the model reads (Speculative Prefill). Default: the one the "
        "registry pairs with the model, if installed (small, for the default model); none: the model's own layers.",
        panel=None)
    max_tokens: int = _setting(DEFAULT_MAX_TOKENS, "Most tokens per answer.", form="max tokens", ge=1, le=MOST_TOKENS)
    read: Literal["auto", "full", "fast", "retrieval"] = _setting(
        "auto", "How a new document's questions read it. auto: where the model has a draft installed (the "
        "default model: small) and the document is long enough, the passages the question's words choose (BM25) are "
        "read alone, with the document's opening where the question names the document (\"this agreement\"; the "
        "draft's attention chooses where no word matches), full "
        "otherwise; full: every layer reads the whole document; fast: a cheap pass (a draft's first layers, or the "
        "model's own) chooses the tokens and the whole model reads only those. Follow-ups are read the same way until "
        "the document is read whole, then selected from that reading. retrieval: every question, follow-ups too, "
        "reads alone the passages its words choose, as retrieval tools answer, and nothing is read whole in the "
        "background (docs/how-it-works.md: Reading what the question chooses).",
        served=True)
    in_parts: Literal["auto", "on", "off"] = _setting(
        "auto", "Which questions are answered from every part of the document in turn, the answer each part's (a "
        "summary, every clause of a kind, a comparison). auto: those whose wording asks about the whole document "
        "(\"Summarize this agreement\", \"List every …\"); on: every question; off: none, each answered from the "
        "entries its question keeps (docs/how-it-works.md: Questions about the whole document).",
        served=True, form="in parts")
    sources: bool = _setting(True, "Name the passages each answer drew on (from its attention).", served=True)
    system: Annotated[str | None, AfterValidator(_not_blank)] = _setting(
        None, "The system prompt (default: kvchat's: answer from the document only, quote exactly, keep it short).")


def panel(name: str) -> str | None:
    return UserSettings.model_fields[name].json_schema_extra["panel"]  # type: ignore[index,return-value]


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
    """The values a setting takes, for one of a few (a Literal, or one left unset); () for the others."""
    annotation = value_type(name)
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def value_type(name: str) -> Any:
    """The type of a value of the setting `name`, unset (None) aside: `int` for `int | None`."""
    annotation = UserSettings.model_fields[name].annotation
    if get_origin(annotation) is UnionType or (get_origin(annotation) is not None and NoneType in get_args(annotation)):
        [annotation] = [kind for kind in get_args(annotation) if kind is not NoneType]
    return annotation


def user_settings(values: Mapping[str, Any], base: UserSettings | None = None,
                  called: Callable[[str], str | None] = lambda _name: None) -> UserSettings:
    """`base` (kvchat's defaults) with `values` set; a wrong value raises invalid_setting's error,
    which names the setting as `called(name)` says where that is not None (the CLI: the
    environment variable or the settings file's key the value came from)."""
    try:
        return UserSettings.model_validate({**(base or UserSettings()).model_dump(), **values})
    except ValidationError as error:
        first = error.errors()[0]
        raise invalid_setting(first, called=called(str(first["loc"][0]))) from None


def invalid_setting(error: Mapping[str, Any], name: str | None = None, kinds: tuple[str, ...] | None = None,
                    hint: str | None = None, called: str | None = None) -> SettingsError:
    """The one message for a wrong value of a setting, from a pydantic error (the CLI's, the
    server's request validation's); `name`: the setting, when the error's location is a front
    end's field for it; `kinds`: the values that front end takes, where fewer than the setting's;
    `hint`: that front end's own, where its bound is not the setting's (the server's budget);
    `called`: the words for where the value came from, said instead of the setting's name."""
    name = name or str(error["loc"][0])
    value, kinds, shown = error.get("input"), kinds or choices(name), called or f"`{name}`"
    if kinds:
        return _not_among(shown, value, kinds)
    field = UserSettings.model_fields[name]
    if field.annotation is bool:
        return SettingsError(f"{shown} is true or false, not {value!r}", hint or f"{str(field.default).lower()} is the default")
    return SettingsError(f"{shown} {_lowered(error['msg'])}, not {value!r}", hint or _default_hint(name))


def _not_among(shown: str, value: object, kinds: tuple[str, ...]) -> SettingsError:
    """A value that is none of `kinds`: the setting's own, or those a front end takes of them."""
    return SettingsError(f"unknown {shown} {value!r}", f"use {_either(kinds)}")


def above_most(name: str, value: object, most: object, why: str, hint: str | None = None) -> SettingsError:
    """A value over a front end's own bound of the setting (the server's budget), said as the field says its own."""
    return SettingsError(f"`{name}` should be less than or equal to {most} ({why}), not {value!r}", hint or _default_hint(name))


def _default_hint(name: str) -> str:
    default = UserSettings.model_fields[name].default
    return "leave it unset" if default is None else f"{default!r} is the default"


def _either(values: tuple[str, ...]) -> str:
    return ", ".join(values[:-1]) + f" or {values[-1]}"


def _lowered(message: str) -> str:
    """pydantic's "Input should be greater than or equal to 1" as "should be greater than or equal to 1"."""
    return message.removeprefix("Input ").removeprefix("Value ")
