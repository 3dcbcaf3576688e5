"""`kvchat doctor`: what to paste into a bug report, and whether a model runs on this machine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import typer
from rich.console import Console

from kvchat.cli.options import MODEL, flag, with_settings
from kvchat.cli.smoke import STAGE_PREFIX
from kvchat.engine import UserSettings, installation
from kvchat.errors import KvchatError
from kvchat.llama import WEIGHTS_ENV
from kvchat.models import resolve_model

SMOKE_TIMEOUT_S = 600
REINSTALL = "pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36"


def smoke_command(model_path: str, gpu_layers: int) -> list[str]:
    return [sys.executable, "-m", "kvchat.cli.smoke", model_path, str(gpu_layers)]


def run_smoke(model: str, gpu_layers: int, report: dict) -> dict[str, object]:
    """The smoke test in a child process: {"ok": True, ...its figures} or {"ok": False, "error": one line}."""
    try:
        model_path = str(resolve_model(model))
    except KvchatError as error:
        return {"ok": False, "error": error.one_line(flag)}
    try:
        child = subprocess.run(smoke_command(model_path, gpu_layers), capture_output=True, text=True,
                               timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the smoke test did not finish in {SMOKE_TIMEOUT_S} s (hint: is the machine busy?)"}
    lines = child.stdout.splitlines()
    stages = [line[len(STAGE_PREFIX):] for line in lines if line.startswith(STAGE_PREFIX)]
    if child.returncode == 0 and lines and not lines[-1].startswith(STAGE_PREFIX):
        return {"ok": True, **json.loads(lines[-1])}
    where = stages[-1] if stages else "starting"
    if child.returncode < 0:
        return {"ok": False, "error": _crash_line(-child.returncode, where, gpu_layers, report)}
    last = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
    return {"ok": False, "error": f"the smoke test failed while {where}: {last}"}


def _crash_line(signal_number: int, where: str, gpu_layers: int, report: dict) -> str:
    """One line: which signal, where, the likely cause and what to do about it."""
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    llama = report["llama_cpp"]
    if gpu_layers > 0:
        cause = "llama.cpp's GPU backend"
        hint = f"try --gpu-layers 0, or rebuild llama-cpp-python for this GPU ({REINSTALL} with CMAKE_ARGS set as docs/gpu.md says)"
    elif llama["weight_layout"] == "extra":
        amx = "AMX" in llama["extra_buffer_types"]
        cause = "llama.cpp's AMX matmul, which crashes on many hosts" if amx else "llama.cpp's repacked CPU weights"
        hint = f"unset {WEIGHTS_ENV} (extra buffer types are experimental)"
    else:
        cause = "a llama.cpp build made for another CPU, or a damaged one"
        hint = f"rebuild it on this machine: {REINSTALL}"
    return f"the smoke test crashed ({name}) while {where}: likely {cause} (hint: {hint})"


@with_settings("gpu_layers")
def doctor_command(
    model: str = MODEL,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    user: UserSettings = UserSettings(),
) -> None:
    """Report versions, llama.cpp's build (GPU offload, CPU features, where weights live), models,
    folders and free memory, then load the model, read and decode a few tokens in a child process.
    Exit 0 when that works, 1 otherwise: paste the output into a bug report."""
    report = installation()
    report["smoke_test"] = smoke = run_smoke(model, user.gpu_layers, report)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print(report, Console(highlight=False, soft_wrap=True, markup=False))  # paths are text, not markup
    if not smoke["ok"]:
        raise typer.Exit(1)


def _size(count: object) -> str:
    if not isinstance(count, int):
        return "unknown"
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.1f} MiB"


def _print(report: dict, console: Console) -> None:
    llama, smoke = report["llama_cpp"], report["smoke_test"]
    console.print(f"kvchat {report['kvchat']} · Python {report['python']} · {report['platform']}")
    console.print(f"llama-cpp-python {report['llama_cpp_python']} · GPU offload: {'yes' if llama['gpu_offload'] else 'no'}")
    console.print(f"llama.cpp: {llama['system_info']}")
    extras = ", ".join(llama["extra_buffer_types"]) or "none"
    console.print(f"CPU weights: {llama['weight_layout']} ({WEIGHTS_ENV}: {', '.join(llama['weight_layouts'])}); "
                  f"extra buffer types offered: {extras}")
    for row in report["models"]:
        state = "verified" if row["verified"] else "assembled, sha256 MISMATCH" if row["assembled"] else \
            "installed (assembled on first use)" if row["installed"] else f"not installed ({row['install']})"
        console.print(f"model {row['name']}: {state} · {row['path']}")
    for name, folder in report["folders"].items():
        console.print(f"{name} folder: {folder['path']} ({_size(folder['bytes'])})")
    memory, cpus = report["memory"], report["cpus"]
    console.print(f"memory: {_size(memory['available_bytes'])} available of {_size(memory['total_bytes'])} · "
                  f"{cpus['count']} CPUs, {cpus['threads']} threads · OpenMP spin count {cpus['openmp_spin_count']}, "
                  f"wait policy {cpus['openmp_wait_policy'] or 'unset'}")
    if smoke["ok"]:
        buffers = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in smoke["weight_buffers_mib"].items())
        console.print(f"smoke test: ok · read {smoke['read_tokens']} tokens at {smoke['read_tok_s']} tok/s, "
                      f"decoded at {smoke['decode_tok_s']} tok/s · weights in {buffers}")
    else:
        console.print(f"smoke test: FAILED · {smoke['error']}")
