"""Bench results: a summary per variant with ratios against the full cache, and the JSON file.

JSON schema (version 2): {"schema": "kvchat-bench/2", "models": [str...], "config": {...},
"complete": bool, "records": [record...], "summary": [summary...]}. The file is written again
after every record, "complete" false until the run ends, so a run stopped midway keeps what it
measured. A record is one variant of one model on one case: model, task, meta, method, variant,
budget, accuracy (0..1, by the task's scoring: RULER's substring match, cuad's normalized match,
L-Eval's metrics, the share of clauses quoted), answer, golds, prompt_tokens, kept_tokens,
compression, kv_bytes_full, kv_bytes_kept, prefill_tokens_per_s, decode_tokens_per_s, ttft_s,
read_s (the prompt's reading time), read (how it was read, in words), reading (the way asked
for: full, retrieval, auto, fast), snapkv_overhead (observe + compact time / reading time),
peak_cells, peak_rss_mib. A summary is one variant of one model over all cases: model, variant,
method, budget, cases, accuracy, accuracy_by_task, kept_of_full (of the cases the full cache
answered right, scoring 1, the share this variant answered right too: for scores that are rarely
whole, as F1, ROUGE-L or clauses quoted, compare accuracy_by_task instead), compression, kv_bytes_kept,
decode_tokens_per_s, decode_speedup (mean over cases of decode tok/s / full's on the same case
and model), kv_saving (kv_bytes_full / kv_bytes_kept), ttft_s, read_s, snapkv_overhead,
against_retrieval (null for retrieval itself or without it: {"cases", "difference": the mean of
this variant's score minus retrieval's at the same budget over the cases both answered,
"interval": its 95% paired bootstrap interval}).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

import numpy as np

from kvchat.atomic import atomic_file

SCHEMA = "kvchat-bench/2"
RESAMPLES = 10_000  # bootstrap resamples of the paired differences


def _case_key(record: dict) -> str:
    return json.dumps([record["model"], record["task"], record["meta"]], sort_keys=True)


def _kept_of_full(rows: list[dict], full_accuracy: dict[str, float]) -> float | None:
    """Of the cases the full cache answered right (same model), the share this variant answered
    right too: what pruning keeps of the full cache's answers. None without such cases."""
    full_right = [r for r in rows if full_accuracy.get(_case_key(r)) == 1.0]
    return round(mean(r["accuracy"] == 1.0 for r in full_right), 3) if full_right else None


def _is_retrieval(record: dict) -> bool:
    """Whether `record` is the baseline every other way of answering is set against, what a user of
    a retrieval tool would get: `--read retrieval`, with no variant's options (which a variant's
    name gives in brackets)."""
    return record["reading"] == "retrieval" and "(" not in record["variant"]


def _against_retrieval(rows: list[dict], retrieval: dict[tuple[str, int], float]) -> dict | None:
    """The mean of this variant's score minus retrieval's (`retrieval`: per case and budget) over
    the cases both answered, with a 95% paired bootstrap interval: whether the difference outgrows
    how much the questions vary."""
    differences = np.array([row["accuracy"] - retrieval[_case_key(row), row["budget"]] for row in rows
                            if (_case_key(row), row["budget"]) in retrieval])
    if _is_retrieval(rows[0]) or not len(differences):
        return None
    resampled = np.random.default_rng(0).choice(differences, size=(RESAMPLES, len(differences))).mean(axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return {"cases": len(differences), "difference": round(float(differences.mean()), 3),
            "interval": [round(float(low), 3), round(float(high), 3)]}


def summarize(records: list[dict]) -> list[dict]:
    retrieval = {(_case_key(r), r["budget"]): r["accuracy"] for r in records if _is_retrieval(r)}
    full_speed = {_case_key(r): r["decode_tokens_per_s"] for r in records if r["method"] == "full"}
    full_accuracy = {_case_key(r): r["accuracy"] for r in records if r["method"] == "full"}
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        grouped[record["model"], record["variant"]].append(record)
    summary = []
    for (model, variant), rows in grouped.items():
        by_task: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            by_task[row["task"]].append(row["accuracy"])
        speedups = [r["decode_tokens_per_s"] / full_speed[_case_key(r)] for r in rows if full_speed.get(_case_key(r))]
        summary.append({
            "model": model, "variant": variant, "method": rows[0]["method"], "budget": rows[0]["budget"], "cases": len(rows),
            "accuracy": round(mean(r["accuracy"] for r in rows), 3),
            "accuracy_by_task": {task: round(mean(values), 3) for task, values in by_task.items()},
            "kept_of_full": _kept_of_full(rows, full_accuracy),
            "compression": round(mean(r["compression"] for r in rows), 2),
            "kv_bytes_kept": round(mean(r["kv_bytes_kept"] for r in rows)),
            "decode_tokens_per_s": round(mean(r["decode_tokens_per_s"] for r in rows), 2),
            "decode_speedup": round(mean(speedups), 2) if speedups else None,
            "kv_saving": round(mean(r["kv_bytes_full"] / r["kv_bytes_kept"] for r in rows), 2),
            "ttft_s": round(mean(r["ttft_s"] for r in rows), 2),
            "read_s": round(mean(r["read_s"] for r in rows), 2),
            "snapkv_overhead": round(mean(r["snapkv_overhead"] for r in rows), 4),
            "against_retrieval": _against_retrieval(rows, retrieval),
        })
    return summary


def write_json(path: Path, models: list[str], config: dict, records: list[dict], complete: bool = True) -> None:
    """Write the results atomically (temp file + rename); `complete`: the run has ended."""
    document = {"schema": SCHEMA, "models": models, "config": config, "complete": complete, "records": records,
                "summary": summarize(records)}
    with atomic_file(path, "w") as out:
        json.dump(document, out, indent=1)
