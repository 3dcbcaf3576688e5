"""What `kvchat doctor` reports: this installation (versions, llama.cpp's build, models, folders,
memory) and a smoke test of one model, run by the doctor in a child process so that a native
crash there becomes a line of the report instead of the end of the caller."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from kvchat.llama import (
    LLAMA_CPP_VERSION, WEIGHT_LAYOUTS, ContextSettings, available_cpus, LlamaContext, LlamaModel, Sampler, SamplerSettings,
    extra_buffer_types, gpu_offload_supported, system_info, weight_layout,
)
from kvchat.models import REGISTRY, ModelEntry, file_sha256, model_status
from kvchat.paths import cache_dir, data_dir, log_dir

SMOKE_TEXT = (
    "This Agreement shall be governed by and construed in accordance with the laws of the State of "
    "Israel. Either party may terminate this Agreement upon ninety days' written notice. "
)
SMOKE_READ_TOKENS = 256
SMOKE_DECODE_TOKENS = 8


def installation() -> dict[str, object]:
    """Everything a bug report needs about this installation, without loading a model."""
    return {
        "kvchat": _version("kvchat"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "llama_cpp_python": LLAMA_CPP_VERSION,
        "llama_cpp": {
            "gpu_offload": gpu_offload_supported(),
            "system_info": system_info(),
            "extra_buffer_types": extra_buffer_types(),
            "weight_layout": weight_layout(),
            "weight_layouts": list(WEIGHT_LAYOUTS),
        },
        "models": [_model_row(entry) for entry in REGISTRY],
        "folders": {name: _folder(path) for name, path in
                    (("data", data_dir()), ("cache", cache_dir()), ("logs", log_dir()))},
        "memory": {"total_bytes": _memory("MemTotal"), "available_bytes": _memory("MemAvailable")},
        "cpus": {"count": os.cpu_count(), "threads": available_cpus(),
                 "openmp_spin_count": os.environ.get("GOMP_SPINCOUNT"), "openmp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
    }


def smoke_test(model_path: Path, gpu_layers: int = 0, stage: Callable[[str], None] = lambda _: None) -> dict[str, object]:
    """Load the model, read a few hundred tokens and decode a few: what every question does.
    `stage` is told each step before it starts, so that a crash can be placed."""
    stage("loading the model")
    with LlamaModel(model_path, gpu_layers=gpu_layers) as model:
        tokens = model.tokenize(SMOKE_TEXT * 16)[:SMOKE_READ_TOKENS]
        read_s, decode_s = time_read_and_decode(model, tokens, SMOKE_DECODE_TOKENS, stage=stage)
        return {
            "model": str(model_path),
            "weight_layout": model.weight_layout,
            "weight_buffers_mib": model.weight_buffers,
            "read_tokens": len(tokens),
            "read_tok_s": round(len(tokens) / read_s, 1),
            "decode_tok_s": round(SMOKE_DECODE_TOKENS / decode_s, 1),
        }


def time_read_and_decode(
    model: LlamaModel, tokens: list[int], decode_tokens: int, threads: int | None = None,
    threads_batch: int | None = None, stage: Callable[[str], None] = lambda _: None,
) -> tuple[float, float]:
    """Seconds to read `tokens` in 512-token batches, and to decode `decode_tokens` greedily after
    them, on a new context of the model."""
    settings = ContextSettings(n_ctx=len(tokens) + decode_tokens + 8, n_batch=512, threads=threads,
                               threads_batch=threads_batch)
    with LlamaContext(model, settings) as ctx:
        stage("reading a prompt")
        start = time.perf_counter()
        for first in range(0, len(tokens), settings.n_batch):
            ctx.decode(tokens[first:first + settings.n_batch], first)
        read_s = time.perf_counter() - start
        stage("decoding")
        sampler = Sampler(SamplerSettings())
        start = time.perf_counter()
        for step in range(decode_tokens):
            ctx.decode([sampler.sample(ctx.handle)], len(tokens) + step)
        decode_s = time.perf_counter() - start
        sampler.close()
    return read_s, decode_s


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # here: 30 ms to import, for `kvchat doctor` alone

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _model_row(entry: ModelEntry) -> dict[str, object]:
    """Installed (its parts), assembled (the GGUF in the data folder) and verified (its sha256
    read again now: a file damaged since its assembly fails here)."""
    status = model_status(entry)
    verified = status.assembled and file_sha256(status.path) == entry.sha256
    return {"name": status.entry.name, "installed": status.packages_installed, "assembled": status.assembled,
            "verified": verified, "path": str(status.path), "install": status.entry.pip_command}


def _folder(path: Path) -> dict[str, object]:
    size = sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) if path.is_dir() else 0
    return {"path": str(path), "bytes": size}


def _memory(field: str) -> int | None:
    """A /proc/meminfo field in bytes (Linux), else what sysconf knows, else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    names = {"MemTotal": "SC_PHYS_PAGES", "MemAvailable": "SC_AVPHYS_PAGES"}
    try:
        return os.sysconf(names[field]) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

