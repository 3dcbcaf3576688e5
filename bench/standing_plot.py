"""docs/bench.md's plot: each way of answering cuad's questions, its share of right answers against
its first token (median, log seconds; the bar from the fastest to the slowest), from the passage
bank's run records under docs/bench/ (one JSON line per answer with "way", "score" and "ttft_s",
after a header line per run with its "command").

Usage: python bench/standing_plot.py [--records docs/bench] [--out docs/bench/standing.png]

Needs matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# Each record file: its label and marker face, and the runs its table in docs/bench.md counts
# (dev's run 3 asked the same questions again, to set the bank beside its q8_0 copy).
SETS = {
    "passage-bank-dev-cuad.jsonl": ("dev: 34 questions, 6.9K–16K tokens", "none", {1, 2, 4}),
    "passage-bank-heldout-cuad.jsonl": ("held-out: 18 questions, 23.5K–24.0K tokens", "full", {1}),
    "passage-bank-long-cuad.jsonl": ("past the context: 11 questions, 56,145 and 56,644 tokens", "left", {1, 2}),
}
WAYS = {  # the ways docs/bench.md's tables show; the variants left off (the packed banks' bank-q8 and bank-q8_0-q4_0 of earlier runs, bank@2048) are not drawn
    "fresh": ("the first answer (--read auto)", "o", "tab:blue"),
    "bank": ("a follow-up from the passage bank (default)", "s", "tab:green"),
    "whole": ("a follow-up from the whole reading (snapkv@1024)", "^", "tab:orange"),
    "retrieval": ("retrieval (--read retrieval)", "D", "tab:red"),
}
# Dev's run 1 timed the whole reading's answers from the reading's start (bench/passage_bank.py times
# them as later questions since its run 2): those answers count, their times do not.
UNTIMED = {("passage-bank-dev-cuad.jsonl", 1, "whole")}


def points(folder: Path) -> list[tuple[str, str, list[float], list[float]]]:
    """(file, way, scores, first-token times) for each record file and way."""
    found = []
    for name, (_, _, runs) in SETS.items():
        scores: dict[str, list[float]] = {}
        times: dict[str, list[float]] = {}
        run = 0
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "command" in row:
                run = row["run"]
            elif run in runs and row.get("way") in WAYS:
                scores.setdefault(row["way"], []).append(row["score"])
                if (name, run, row["way"]) not in UNTIMED:
                    times.setdefault(row["way"], []).append(row["ttft_s"])
        found += [(name, way, scores[way], times[way]) for way in WAYS if way in scores]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=Path("docs/bench"))
    parser.add_argument("--out", type=Path, default=Path("docs/bench/standing.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8, 6))
    for name, way, scores, times in points(args.records):
        label, marker, colour = WAYS[way]
        median, share, face = statistics.median(times), sum(scores) / len(scores), SETS[name][1]
        ax.errorbar(median, share, xerr=[[median - min(times)], [max(times) - median]], fmt=marker, color=colour,
                    markersize=9, fillstyle=face, markerfacecolor="white" if face == "none" else None,
                    capsize=3, elinewidth=1, alpha=0.85)
        ax.annotate(f"{sum(scores):g}/{len(scores)}", (median, share), textcoords="offset points", fontsize=7,
                    xytext=(0, 9 if way in ("fresh", "bank") else -14), ha="center", color=colour)
    ax.set_xscale("log")
    ax.set_xticks([0.5, 1, 2, 5, 10, 20, 50], ["0.5", "1", "2", "5", "10", "20", "50"])
    ax.set_xlabel("first token, s (median, model loaded; bar: fastest to slowest)")
    ax.set_ylabel("right answers, share")
    ax.set_ylim(0.6, 1.06)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("kvchat on cuad: the default model, budget 1,024, 2 CPU cores")
    ways = [Line2D([], [], marker=marker, color=colour, linestyle="", label=label) for label, marker, colour in WAYS.values()]
    sets = [Line2D([], [], marker="o", color="grey", linestyle="", fillstyle=face,
                   markerfacecolor="white" if face == "none" else None, label=label) for label, face, _ in SETS.values()]
    ax.legend(handles=ways + sets, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
