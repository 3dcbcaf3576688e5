"""`kvchat bench`: run every method on every case, one record per method x case."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvchat.bench.compare import answer_of, compare
from kvchat.bench.cuad import cuad_cases
from kvchat.bench.instructions import INSTRUCTIONS
from kvchat.bench.lists import list_cases
from kvchat.bench.leval import LEVAL_TASKS, LevalSelection, leval_cases, leval_folder
from kvchat.bench.tasks import (
    MULTIKEY_TASKS, Case, CountTokens, case_score, multikey_case, needle_case, variable_tracking_case,
)
from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.errors import SettingsError
from kvchat.events import Pruned
from kvchat.policy import DEFAULT_BUDGET, METHODS, SnapKV, method_carrying, method_options

TASKS = ("needle", "multikey", "multikey16", "vt", "cuad", "cuad-lists", *LEVAL_TASKS)
DEFAULT_TASKS = ("needle", "multikey", "vt")  # cuad and L-Eval read whole documents (up to 32K tokens): asked for by name
# What a variant may set of the reading: how it reads, and a fast reading's settings (FastSettings), by their names in a variant
READING_OPTIONS = {"read": str, "fast_depth": float, "fast_positions": str, "fast_layers": int, "fast_reread": int, "fast_spans": str,
                   "fast_heads": str, "fast_choose": str, "fast_opening": int, "fast_opening_for": str}
# What a variant may set of the KV cache's layout (KvLayout): such a variant reads the document again, in its layout
def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise SettingsError(f"bad variant value flash_attn={value!r}", "use flash_attn=on or flash_attn=off")
    return value == "on"


LAYOUT_OPTIONS = {"flash_attn": _on_off, "type_k": str, "type_v": str}
PROMPT_ROOM = 512  # tokens of the model's trained context left to the template and the question


def _typed(key: str, value: str, kind: Callable[[str], object]) -> Any:
    """A variant's `key=value`, as the option's type; a value that is not one is refused."""
    try:
        return kind(value)
    except ValueError:
        raise SettingsError(f"bad variant value {key}={value!r}", "give each option a value of its kind, e.g. whole=2048 or kernel=5") from None


def instruction_named(name: str) -> str:
    if name not in INSTRUCTIONS:
        raise SettingsError(f"unknown instruction {name!r}", f"use system={', system='.join(INSTRUCTIONS)}")
    return INSTRUCTIONS[name]


@dataclass(frozen=True)
class Variant:
    """A method at a budget, with optional policy overrides (`pool=avg,kernel=5`), read in full
    or fast (AskSettings.read), in the default KV layout or another (`type_k=q8_0,flash_attn=on`),
    with kvchat's system prompt or a candidate's (`system=quote`, instructions.py), answered from
    the entries kept or from the whole document in parts (`whole=2048`, or `whole=auto`: by the
    question's wording; engine/answering/in_parts.py)."""

    method: str
    budget: int
    overrides: tuple[tuple[str, str], ...] = ()
    read: str = "full"

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.overrides)
        label = self.method if self.method == "full" else f"{self.method}@{self.budget}" + (f"({extra})" if extra else "")
        return label if self.read == "full" else f"{label} {self.read}"

    def settings(self, base: AskSettings) -> AskSettings:
        """`base` with this variant's method, budget and read; an override names a method option
        (kernel, heads …), one of the reading's (READING_OPTIONS) or of the layout's (LAYOUT_OPTIONS),
        the system prompt's (`system`) or whether a question is answered in parts (`whole`: a part's
        tokens for every question, `auto` for the questions whose wording asks about the whole, as
        the defaults do, or `off`)."""
        carried = method_options(base.method)
        options: dict[str, object] = {"budget": self.budget}
        read, fast, system, in_parts, part_tokens = self.read, base.fast, base.system, base.in_parts, base.part_tokens
        layout: dict[str, object] = {}  # applied together: a q8_0 V needs flash attention, in whatever order they come
        for key, value in self.overrides:
            if key == "read":
                read = value
            elif key == "system":
                system = instruction_named(value)
            elif key == "whole" and value in ("auto", "off"):  # as a user's --in-parts: the wording decides, or never in parts
                in_parts = value
            elif key == "whole":  # every question answered in parts of this many tokens
                in_parts, part_tokens = "on", _typed(key, value, int)
            elif key in LAYOUT_OPTIONS:
                layout[key] = _typed(key, value, LAYOUT_OPTIONS[key])
            elif key in READING_OPTIONS:
                fast = replace(fast, **{key.removeprefix("fast_"): _typed(key, value, READING_OPTIONS[key])})
            else:
                current = carried.get(key, getattr(METHODS[self.method](), key, value))  # typed as the option's default
                options[key] = _typed(key, value, type(current)) if not isinstance(current, bool) else value == "true"
        _refuse_unread_fast_options(self.overrides, read)
        return replace(base, method=method_carrying(self.method, carried, **options), read=read, fast=fast,
                       layout=replace(base.layout, **layout), system=system, in_parts=in_parts, part_tokens=part_tokens)


def _refuse_unread_fast_options(overrides: tuple[tuple[str, str], ...], read: str) -> None:
    """A fast reading's own options (fast_*) choose only for read=fast or retrieval: the defaults
    (auto) read as AskSettings.fast_reading says, and a full reading chooses nothing."""
    unread = [key for key, _ in overrides if key in READING_OPTIONS and key != "read"]
    if unread and read not in ("fast", "retrieval"):
        raise SettingsError(f"{unread[0]} changes nothing with read={read}: the fast_* options set a fast reading's own choice",
                            "add read=fast (or read=retrieval) to the variant, e.g. read=fast,fast_choose=bm25,fast_opening=1")


@dataclass(frozen=True)
class BenchConfig:
    tasks: tuple[str, ...] = DEFAULT_TASKS
    lengths: tuple[int, ...] = (2000, 4000)
    depths: tuple[float, ...] = (0.25, 0.75)
    budgets: tuple[int, ...] = (DEFAULT_BUDGET,)
    methods: tuple[str, ...] = tuple(METHODS)
    policy_variants: tuple[tuple[tuple[str, str], ...], ...] = field(default=())
    decode_tokens: int = 64
    seed: int = 0
    samples: int = 1  # texts made for each made-up case (needle, multikey, vt), each of its own seed, as RULER averages
    cuad_ids: tuple[str, ...] | None = None  # the cuad questions asked; None: all of them
    cuad_data: str | None = None  # a folder of cuad questions and contracts; None: the shipped ones
    reads: tuple[str, ...] = ("full",)  # with "fast" or "retrieval": snapkv at each budget read so too; without "full": read so only
    leval_data: str | None = None  # the folder of L-Eval's task files (leval.py)
    leval: LevalSelection = LevalSelection()  # which of their documents and questions are asked
    gpu_layers: int = 0  # the model's layers on the GPU
    layout: KvLayout = KvLayout()  # the KV cache's layout, unless a variant names its own (flash_attn=on …)

    def variants(self) -> list[Variant]:
        read_full = "full" in self.reads  # without it, only what is read fast: the variants that say so, and snapkv
        found = [Variant("full", max(self.budgets))] if "full" in self.methods and read_full else []
        for budget in self.budgets:
            found += [Variant(m, budget) for m in self.methods if m != "full"] if read_full else []
            found += [Variant("snapkv", budget, overrides) for overrides in self.policy_variants
                      if read_full or any(key == "read" and value != "full" for key, value in overrides)]
            found += [Variant("snapkv", budget, read=read) for read in ("fast", "retrieval") if read in self.reads]
        return found


# cuad's quick subset: five questions about the shortest contract (6.9K tokens), so that it reads
# least (its time in docs/bench.md).
QUICK_CUAD = ("todos.reseller", "todos.initial_term", "todos.notice", "todos.law", "todos.warranty")
# L-Eval's quick subset: the first three questions of the shortest document of each task's dev part.
QUICK = BenchConfig(tasks=("needle", "multikey"), lengths=(2000,), depths=(0.5,), decode_tokens=16,
                    cuad_ids=QUICK_CUAD, leval=LevalSelection(part="dev", documents=1, questions=3, shortest_first=True))


def build_cases(config: BenchConfig, count_tokens: CountTokens, max_document_tokens: int) -> list[Case]:
    """The config's cases; real documents longer than `max_document_tokens` are cut to it."""
    cases: list[Case] = []
    longest = max(config.lengths)
    for sample in range(config.samples):
        seed = config.seed + sample * len(config.depths)  # the first sample's seeds are the config's own
        if "needle" in config.tasks:
            cases += [needle_case(count_tokens, n, d, seed + i) for n in config.lengths for i, d in enumerate(config.depths)]
        for task, n_keys in MULTIKEY_TASKS.items():
            if task in config.tasks:
                cases.append(multikey_case(count_tokens, longest, n_keys, seed))
        if "vt" in config.tasks:
            cases.append(variable_tracking_case(count_tokens, longest, seed))
    folder = None if config.cuad_data is None else Path(config.cuad_data)
    if "cuad" in config.tasks:
        cases += cuad_cases(count_tokens, max_document_tokens, config.cuad_ids, folder)
    if "cuad-lists" in config.tasks:  # about the contracts --questions names, or all
        contracts = None if config.cuad_ids is None else tuple(dict.fromkeys(i.split(".")[0] for i in config.cuad_ids))
        cases += list_cases(count_tokens, max_document_tokens, contracts, folder)
    leval_tasks = tuple(task for task in config.tasks if task in LEVAL_TASKS)
    if leval_tasks:
        cases += leval_cases(count_tokens, max_document_tokens, leval_tasks, leval_folder(config.leval_data), config.leval)
    return cases


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _record(model: str, case: Case, variant: Variant, events: list) -> dict[str, object]:
    done = answer_of(events)
    stats = done.stats
    pruned = [e for e in events if isinstance(e, Pruned)]
    read_s = stats.prompt_tokens / stats.prefill_tokens_per_s if stats.prefill_tokens_per_s else 0.0
    overhead = sum(e.observe_s + e.compact_s for e in pruned) / read_s if read_s else 0.0
    return {
        "model": model, "task": case.task, "meta": case.meta, "method": variant.method, "variant": variant.label,
        "budget": variant.budget, "accuracy": case_score(case, done.answer), "answer": done.answer,
        "golds": list(case.answers), "prompt_tokens": stats.prompt_tokens, "kept_tokens": stats.kept_tokens,
        "compression": round(stats.compression, 3), "kv_bytes_full": stats.kv_bytes_full,
        "kv_bytes_kept": stats.kv_bytes_kept, "prefill_tokens_per_s": round(stats.prefill_tokens_per_s, 2),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2), "ttft_s": round(stats.ttft_s, 3),
        "read_s": round(read_s, 3), "snapkv_overhead": round(overhead, 4), "peak_cells": stats.peak_cells,
        "compact_s": round(sum(e.compact_s for e in pruned), 4), "read": stats.read,
        "reading": variant.settings(AskSettings()).read,
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "kept_histogram": _kept_histogram(pruned[-1]) if pruned else None,
    }


HISTOGRAM_BINS = 32


def _kept_histogram(pruned: Pruned) -> list[int]:
    """How many of the kept tokens fall in each of the prompt's HISTOGRAM_BINS equal parts: how
    thin the question's votes spread over the document (a lookup's cluster, a summary's spread)."""
    bins = np.minimum(np.asarray(pruned.kept_positions) * HISTOGRAM_BINS // max(pruned.prompt_tokens, 1), HISTOGRAM_BINS - 1)
    return np.bincount(bins, minlength=HISTOGRAM_BINS).tolist()


def _by_document(cases: list[Case]) -> list[list[Case]]:
    """The cases grouped by the document they ask about, in order of first appearance."""
    groups: dict[tuple[str, str], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.task, case.document), []).append(case)
    return list(groups.values())


def run_bench(engine: Engine, config: BenchConfig) -> Iterator[tuple[int, int, dict[str, object] | None]]:
    """Yields (answers done, answers in all, record or None); one record per variant x case. Each
    document is read once for all its questions (see `compare`)."""
    cases = build_cases(config, engine.model.count_tokens,
                        engine.model.shape.n_ctx_train - PROMPT_ROOM)
    variants = config.variants()
    # every question answered from the entries kept, unless a variant says `whole=N`
    base = AskSettings(max_tokens=config.decode_tokens, method=SnapKV(), method_named=True, sources=False, in_parts="off",
                       layout=config.layout)
    all_settings = [variant.settings(base) for variant in variants]
    total, done = len(cases) * len(variants), 0
    yield done, total, None
    for group in _by_document(cases):
        for case_index, variant_index, events in compare(engine, group, all_settings):
            done += 1
            yield done, total, _record(engine.model_name, group[case_index], variants[variant_index], events)
