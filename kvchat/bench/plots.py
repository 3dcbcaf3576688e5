"""PNG figures of a bench run (matplotlib, no display needed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def needle_heatmap(records: list[dict], path: Path) -> Path | None:
    """Context length x depth, one panel per variant, colour = accuracy (as in the SnapKV paper)."""
    needle = [r for r in records if r["task"] == "needle"]
    if not needle:
        return None
    variants = list(dict.fromkeys(r["variant"] for r in needle))
    lengths = sorted({r["meta"]["length"] for r in needle})
    depths = sorted({r["meta"]["depth"] for r in needle})
    figure, axes = plt.subplots(1, len(variants), figsize=(2.6 * len(variants) + 1, 3), squeeze=False, sharey=True)
    for axis, variant in zip(axes[0], variants):
        grid = [[mean([r["accuracy"] for r in needle if r["variant"] == variant and r["meta"]["length"] == n
                       and r["meta"]["depth"] == d] or [float("nan")]) for n in lengths] for d in depths]
        image = axis.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for row, values in enumerate(grid):
            for column, value in enumerate(values):
                axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=8)
        axis.set_title(variant, fontsize=9)
        axis.set_xticks(range(len(lengths)), [f"{n / 1000:g}k" for n in lengths])
        axis.set_xlabel("context length")
    axes[0][0].set_yticks(range(len(depths)), [f"{int(d * 100)}%" for d in depths])
    axes[0][0].set_ylabel("needle depth")
    figure.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def accuracy_vs_budget(records: list[dict], path: Path) -> Path:
    by_method: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_method[record["method"]][record["budget"]].append(record["accuracy"])
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for method, budgets in by_method.items():
        if method == "full":  # no budget: a reference line
            axis.axhline(mean(v for values in budgets.values() for v in values), color="black", ls="--", label="full")
            continue
        xs = sorted(budgets)
        axis.plot(xs, [mean(budgets[x]) for x in xs], marker="o", label=method)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("KV budget (entries)")
    axis.set_ylabel("accuracy")
    axis.set_ylim(-0.05, 1.05)
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def decode_speed_vs_length(records: list[dict], path: Path) -> Path:
    by_variant: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for record in records:
        by_variant[record["variant"]].append((record["prompt_tokens"], record["decode_tokens_per_s"]))
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for variant, points in by_variant.items():
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=variant)
    axis.set_xlabel("prompt tokens")
    axis.set_ylabel("decode tokens/s")
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def write_plots(records: list[dict], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        needle_heatmap(records, folder / "needle_heatmap.png"),
        accuracy_vs_budget(records, folder / "accuracy_vs_budget.png"),
        decode_speed_vs_length(records, folder / "decode_speed_vs_length.png"),
    ]
    return [path for path in written if path is not None]
