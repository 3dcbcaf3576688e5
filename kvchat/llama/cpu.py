"""Where llama.cpp keeps a model's weights on the CPU, and the CPU features it was built for.

Besides its plain CPU buffer, llama.cpp offers a model loader "extra" buffer types: CPU_REPACK
(weights re-laid in interleaved blocks for its GEMM kernels) and, in a build compiled for a CPU
with AMX, an AMX buffer whose matmul crashes on common cloud hosts (Sapphire Rapids class;
llama.cpp #20824). A source build uses -march=native, so a user's own build on such a host has
it, and llama.cpp prefers it for Q4_K weights. kvchat therefore asks for no extra buffer type:

- "plain" (the default): llama.cpp's use_extra_bufts off. It read a prompt fastest both where it
  was measured with and without AVX-512 (docs/cpu.md), which is most of an answer's wait;
- "extra": every extra buffer type this build has, as llama.cpp chooses by default: CPU_REPACK,
  and AMX on an AMX build. Experimental: opt in with KVCHAT_CPU_WEIGHTS=extra.
"""

from __future__ import annotations

import ctypes
import os
import re

from kvchat.errors import SettingsError
from kvchat.llama._lib import backend_ready, ggml_base, ggml_registry, raw

WEIGHTS_ENV = "KVCHAT_CPU_WEIGHTS"
WEIGHT_LAYOUTS = ("plain", "extra")
_DEVICE_TYPE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
# llama.cpp's load log names each weight buffer: "load_tensors:   CPU_REPACK model buffer size =   450.00 MiB"
_BUFFER_LINE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")


def weight_layout() -> str:
    """The layout `KVCHAT_CPU_WEIGHTS` asks for ("plain" when unset)."""
    layout = os.environ.get(WEIGHTS_ENV, "").strip().lower() or WEIGHT_LAYOUTS[0]
    if layout not in WEIGHT_LAYOUTS:
        raise SettingsError(
            f"{WEIGHTS_ENV}={layout!r} is not a CPU weight layout",
            f"use one of {', '.join(WEIGHT_LAYOUTS)}, or unset it",
        )
    return layout


def apply_weight_layout(params: object, layout: str) -> None:
    """Set a `llama_model_params` for `layout` (see the module's docstring)."""
    params.use_extra_bufts = layout == "extra"  # type: ignore[attr-defined]


def weight_buffers(log_lines: list[str]) -> dict[str, float]:
    """MiB of weights per buffer type, from the lines llama.cpp logged while loading a model."""
    buffers: dict[str, float] = {}
    for line in log_lines:
        match = _BUFFER_LINE.search(line)
        if match:
            buffers[match.group(1)] = buffers.get(match.group(1), 0.0) + float(match.group(2))
    return buffers


def extra_buffer_types() -> list[str]:
    """The extra CPU buffer types this llama.cpp build offers a model loader, in the order it
    prefers them (ggml_backend_dev_get_extra_bufts): e.g. ["AMX", "CPU_REPACK"]."""
    backend_ready()
    base = ggml_base()
    device = ggml_registry().ggml_backend_dev_by_type(_DEVICE_TYPE_CPU)
    registry = base.ggml_backend_dev_backend_reg(device)
    address = base.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return []
    array = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    names: list[str] = []
    while array and array[len(names)]:
        names.append(base.ggml_backend_buft_name(array[len(names)]).decode())
    return names


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (which taskset and a container's cpuset
    narrow), where the OS has one, else every CPU. kvchat's default thread count, for reading
    and decoding alike: measured best alone and beside another process (docs/cpu.md)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def system_info() -> str:
    """llama.cpp's own line of the CPU features and backends it was built with."""
    backend_ready()
    return raw.llama_print_system_info().decode("utf-8", errors="replace").strip()
