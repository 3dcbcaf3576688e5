"""`kvchat bench`: what compression costs and buys on this machine and this model."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kvchat.bench.cuad import cuad_contracts, cuad_ids_named
from kvchat.bench.leval import LEVAL_TASKS, PARTS, in_part, leval_documents, leval_folder, task_file
from kvchat.bench.leval_metrics import require_rouge
from kvchat.bench.report import summarize, write_json
from kvchat.cli.options import check_draft, warn_about_gpu_layers, with_settings
from kvchat.bench.runner import LAYOUT_OPTIONS, QUICK, READING_OPTIONS, TASKS, BenchConfig, run_bench
from kvchat.engine import AskSettings, Engine, UserSettings, ask_settings, draft_for
from kvchat.errors import SettingsError
from kvchat.models import resolve_model
from kvchat.policy import METHODS


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _length(text: str) -> int:
    text = text.lower()
    return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def _overrides(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in _split(text):
        key, _, value = item.partition("=")
        if key not in ("pool", "kernel", "window", "heads", "spans", "sinks", "words", "system", "whole", *READING_OPTIONS, *LAYOUT_OPTIONS) or not value:
            raise SettingsError(f"bad variant {item!r}", "use e.g. --variant pool=avg,kernel=5, read=fast,fast_depth=0.4, "
                                "flash_attn=on,type_v=q8_0, system=quote or whole=2048")
        pairs.append((key, value))
    return tuple(pairs)


def _config(quick: bool, tasks: str | None, lengths: str | None, depths: str | None, budgets: list[int],
            methods: str | None, variants: list[str], questions: str | None, cuad_data: Path | None,
            reads: str | None = None, leval: LevalOptions | None = None) -> BenchConfig:
    config = QUICK if quick else BenchConfig()
    changes: dict[str, object] = {"budgets": tuple(budgets) or config.budgets,
                                  "policy_variants": tuple(_overrides(v) for v in variants)}
    if tasks:
        unknown = set(_split(tasks)) - set(TASKS)
        if unknown:
            raise SettingsError(f"unknown task(s) {sorted(unknown)}", f"use {', '.join(TASKS)}")
        changes["tasks"] = tuple(_split(tasks))
    if lengths:
        changes["lengths"] = tuple(_length(n) for n in _split(lengths))
    if depths:
        changes["depths"] = tuple(float(d) for d in _split(depths))
    if methods:
        unknown = set(_split(methods)) - set(METHODS)
        if unknown:
            raise SettingsError(f"unknown method(s) {sorted(unknown)}", f"use {', '.join(METHODS)}")
        changes["methods"] = tuple(_split(methods))
    if reads:
        if set(_split(reads)) - {"full", "fast", "retrieval"}:
            raise SettingsError(f"unknown reading(s) in {reads!r}", "use --read full,fast,retrieval")
        changes["reads"] = tuple(_split(reads))
    if cuad_data is not None:
        cuad_contracts(cuad_data)  # refuses a folder without questions.json or a contract before loading a model
        changes["cuad_data"] = str(cuad_data)
    if questions:
        changes["cuad_ids"] = cuad_ids_named(tuple(_split(questions)), cuad_data)
    config = replace(config, **changes)  # type: ignore[arg-type]
    return _with_leval(config, leval or LevalOptions())


@dataclass(frozen=True)
class LevalOptions:
    data: Path | None = None
    part: str | None = None
    documents: int | None = None
    questions: int | None = None
    skip: int | None = None


def _with_leval(config: BenchConfig, options: LevalOptions) -> BenchConfig:
    """The config with the L-Eval options; its task files are found (and summaries' scorer too)
    before any model is loaded."""
    tasks = [task for task in config.tasks if task in LEVAL_TASKS]
    if options.part is not None and options.part not in PARTS:
        raise SettingsError(f"unknown --leval-part {options.part!r}", f"use {', '.join(PARTS)}")
    if not tasks:
        return config
    folder = leval_folder(None if options.data is None else str(options.data))
    for task in tasks:
        task_file(folder, LEVAL_TASKS[task])
    if any(LEVAL_TASKS[task].scoring == "leval-rouge" for task in tasks):
        require_rouge()
    selection = replace(config.leval, **{key: value for key, value in asdict(options).items()
                                         if key != "data" and value is not None})
    for task in tasks if selection.skip else ():
        count = len(in_part(leval_documents(folder, task), selection.part))
        if selection.skip >= count:
            raise SettingsError(f"--leval-skip {selection.skip} leaves {task} no document of its {selection.part} part (it has {count})",
                                "skip fewer, or leave that task out of --tasks")
    return replace(config, leval_data=str(folder), leval=selection)


def _against_retrieval(row: dict) -> str:
    """`+0.012 (-0.030…+0.050)`: the mean score over retrieval's on the same questions, and its 95% interval."""
    against = row["against_retrieval"]
    if against is None:
        return "—"
    low, high = against["interval"]
    return f"{against['difference']:+.3f} ({low:+.3f}…{high:+.3f})"


def _table(summary: list[dict]) -> Table:
    tasks = list(dict.fromkeys(task for row in summary for task in row["accuracy_by_task"]))
    several_models = len({row["model"] for row in summary}) > 1
    with_retrieval = any(row["against_retrieval"] for row in summary)
    table = Table(title="kvchat bench: accuracy per task, memory and speed")
    if several_models:
        table.add_column("model", no_wrap=True)
    table.add_column("variant", no_wrap=True, min_width=12)
    for column in tasks + ["vs retrieval"] * with_retrieval + ["of full", "compr.", "KV MiB", "tok/s", "speedup", "read s", "TTFT s"]:
        table.add_column(column, justify="right", no_wrap=column == "vs retrieval")
    for row in summary:
        speedup = "—" if row["decode_speedup"] is None else f"{row['decode_speedup']:.2f}x"
        accuracy = [f"{row['accuracy_by_task'].get(task, float('nan')):.2f}" for task in tasks]
        names = [Text(Path(row["model"]).name), Text(row["variant"])] if several_models else [Text(row["variant"])]
        of_full = "—" if row["kept_of_full"] is None else f"{row['kept_of_full']:.0%}"
        table.add_row(*names, *accuracy, *[_against_retrieval(row)] * with_retrieval, of_full, f"{row['compression']:.1f}x",
                      f"{row['kv_bytes_kept'] / 2**20:.1f}", f"{row['decode_tokens_per_s']:.1f}", speedup,
                      f"{row['read_s']:.1f}", f"{row['ttft_s']:.1f}")
    return table


def _run(model: str, config: BenchConfig, console: Console, keep: Callable[[dict], None], draft: str | None = None) -> None:
    """One model's run, with a progress bar; `keep` takes each record as it comes."""
    with Engine(model, gpu_layers=config.gpu_layers, use_cache=False, draft=draft) as engine, Progress(
        TextColumn("bench {task.fields[model]}", markup=False), BarColumn(), MofNCompleteColumn(), TextColumn("answers"),
        TimeElapsedColumn(), console=console, transient=True,
    ) as progress:
        task = progress.add_task("bench", model=model)
        for done, total, record in run_bench(engine, config):
            progress.update(task, completed=done, total=total)
            if record is not None:
                keep(record)


@with_settings("draft", "gpu_layers", "flash_attn")
def bench_command(
    budget: list[int] = typer.Option([], "--budget", help=f"KV budget; repeat for several (default {UserSettings().budget})."),
    tasks: str | None = typer.Option(None, help=f"Comma-separated: {', '.join(TASKS)}."),
    lengths: str | None = typer.Option(None, help="Context lengths, e.g. 2k,4k,8k,16k."),
    depths: str | None = typer.Option(None, help="Needle depths in 0..1, e.g. 0.1,0.5,0.9."),
    samples: int = typer.Option(1, min=1, help="needle, multikey, vt: this many texts of each case, each made from its own seed (scores are their mean)."),
    methods: str | None = typer.Option(None, help=f"Comma-separated: {', '.join(METHODS)}."),
    questions: str | None = typer.Option(None, help="cuad: the questions asked, by id or contract, e.g. todos,corio.law."),
    cuad_data: Path | None = typer.Option(None, help="cuad: a folder with questions.json and the contracts' .txt files, instead of the shipped ones."),
    variant: list[str] = typer.Option([], "--variant", help="Extra snapkv variant, e.g. pool=avg,kernel=5, read=fast,fast_depth=0.4, a KV layout, read again in it: flash_attn=on,type_v=q8_0, another system prompt: system=quote (kvchat/bench/instructions.py), or answers from the whole document in parts of N tokens: whole=2048 (whole=auto: only where the question's wording asks about the whole, as the defaults do)."),
    read: str | None = typer.Option(None, "--read", help="full, or full,fast: snapkv at each budget read fast too (the first layers choose); fast alone: only the fast readings (and the variants that read fast)."),
    models: list[str] = typer.Option([], "--model", "-m", help="Registry name (see `kvchat models`) or a GGUF path; repeat to compare models in one run (default: default)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write every record and the summary here."),
    plot: Path | None = typer.Option(None, "--plot", help="Write PNG figures into this folder."),
    quick: bool = typer.Option(False, help="A small grid that finishes in a few minutes."),
    leval_data: Path | None = typer.Option(None, help="L-Eval: its data folder (LEval-data of a clone of https://github.com/OpenLMLab/LEval)."),
    leval_part: str | None = typer.Option(None, help="L-Eval: dev (the first half of each task's documents), held-out (the rest) or all (default; dev with --quick)."),
    leval_docs: int | None = typer.Option(None, min=1, help="L-Eval: the first N documents of the part (after those skipped), per task."),
    leval_questions: int | None = typer.Option(None, min=1, help="L-Eval: the first N questions of each document."),
    leval_skip: int | None = typer.Option(None, min=0, help="L-Eval: leave out the part's first N documents per task, in its order (shortest first with --quick); --leval-docs counts after them."),
    user: UserSettings = UserSettings(),
) -> None:
    """Measure accuracy, decode speed and KV memory of each method side by side, in one run."""
    leval = LevalOptions(leval_data, leval_part, leval_docs, leval_questions, leval_skip)
    config = _config(quick, tasks, lengths, depths, budget, methods, variant, questions, cuad_data, read, leval)
    config = replace(config, samples=samples, gpu_layers=user.gpu_layers,
                     layout=ask_settings(user).layout)  # the layout: every variant's, unless it names its own
    readings = {each.settings(AskSettings()).read for each in config.variants()}  # refuses bad settings before loading anything
    reading = "fast" if readings - {"full", "retrieval"} else "full"  # the draft serves fast readings
    check_draft(user.draft, reading, "add --read full,fast")
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # refused before a run of minutes
        raise SettingsError("--plot draws with matplotlib, which is not installed", "pip install 'kvchat[bench]'")
    models = list(dict.fromkeys(models)) or ["default"]
    drafts = {name: draft_for(name, user.draft, reading) for name in models}  # each model's own pair unless named
    for name in models:  # a missing second model is refused before the first one's run
        resolve_model(name)
    console = Console(stderr=True)
    warn_about_gpu_layers(user.gpu_layers, console)
    records: list[dict] = []

    def keep(record: dict) -> None:
        records.append(record)
        if json_path is not None:  # a run stopped midway keeps what it measured
            write_json(json_path, models, asdict(config), records, complete=False)

    for name in models:
        _run(name, config, console, keep, drafts[name])
    summary = summarize(records)
    output = Console()
    if not output.is_terminal:
        output.width = 160  # files and pipes get the whole table, not 80 columns
    output.print(_table(summary))
    if json_path is not None:
        write_json(json_path, models, asdict(config), records)
        console.print(f"wrote {json_path}", markup=False)
    if plot is not None:
        from kvchat.bench.plots import write_plots  # matplotlib: imported only when plotting

        for name in models:  # one folder per model when several
            folder = plot if len(models) == 1 else plot / Path(name).stem
            for path in write_plots([r for r in records if r["model"] == name], folder):
                console.print(f"wrote {path}", markup=False)
