"""The raw bindings: llama_cpp's low-level module and the few ggml functions it does not bind.

Every raw `llama_*` / `ggml_*` name kvchat uses lives in this package (kvchat.llama), so that a
renamed upstream API is fixed here and nowhere else.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import sys
from functools import cache

# llama.cpp's CPU threads meet at a barrier after every op, and OpenMP (libgomp) makes a thread
# that arrives first spin 300,000 times before it sleeps. While another process holds a core,
# the spinning thread keeps the one it waits for off the CPU: on 2 cores, decoding beside a second
# llama.cpp process fell to a fifth of its speed or less. A short spin keeps most of the speed alone and
# degrades gracefully beside another process (docs/cpu.md). libgomp reads this once, when
# llama_cpp's import loads it; a value the user set is kept.
OPENMP_SPIN_COUNT = "3000"
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT

# A CUDA build's libggml-cuda carries copies of libstdc++'s stream code and exports them. After
# `import bm25s` (whose imports load C++ extensions), llama.cpp's model loader bound to those
# copies and crashed in print_info (CUDA 13, an H100); with libstdc++ loaded globally first it
# did not. Made global before llama.cpp's libraries load, the one libstdc++ serves them all.
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # a system without it: llama.cpp's libraries bring their own
        pass

import llama_cpp as raw  # noqa: E402  (re-exported for the adapter modules; after the spin count and libstdc++)


def _library_path(stem: str) -> pathlib.Path:
    lib_dir = pathlib.Path(raw.__file__).parent / "lib"
    suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
    prefix = "" if sys.platform == "win32" else "lib"
    return lib_dir / f"{prefix}{stem}{suffix}"


@cache
def ggml_base() -> ctypes.CDLL:
    """libggml-base with the tensor accessors the attention probe needs, and the device and
    buffer-type calls that choose where weights live (cpu.py)."""
    lib = ctypes.CDLL(str(_library_path("ggml-base")))
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_get_data.argtypes = [ctypes.c_void_p]
    lib.ggml_get_data.restype = ctypes.c_void_p
    lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    lib.ggml_is_contiguous.restype = ctypes.c_bool
    lib.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buffer_is_host.restype = ctypes.c_bool
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    return lib


@cache
def ggml_blocks() -> ctypes.CDLL:
    """libggml-base's block types as ggml itself writes and reads them (llama/packed.py): f32
    values to blocks (ggml_quantize_chunk), each type's blocks back to f32 (dequantize_row_<type>),
    and a type's block size."""
    lib = ggml_base()
    for reader in ("dequantize_row_q8_0", "dequantize_row_q5_0", "dequantize_row_q4_0"):
        getattr(lib, reader).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]  # blocks, values, their count
        getattr(lib, reader).restype = None
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_type_size.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    return lib


@cache
def ggml_cpu_rows() -> ctypes.CDLL:
    """libggml-cpu's f16 <-> f32 rows, with the CPU's own instructions (F16C, NEON): ten times
    libggml-base's portable ones (6 ms against 71 ms for 20M values, 2 x86 cores)."""
    lib = ctypes.CDLL(str(_library_path("ggml-cpu")))
    for convert in ("ggml_cpu_fp16_to_fp32", "ggml_cpu_fp32_to_fp16"):
        getattr(lib, convert).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]  # from, to, the values
        getattr(lib, convert).restype = None
    return lib


@cache
def ggml_registry() -> ctypes.CDLL:
    """libggml: the backend registry, which finds the CPU device."""
    lib = ctypes.CDLL(str(_library_path("ggml")))
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    return lib


class GgmlTensorHead(ctypes.Structure):
    """The first fields of `struct ggml_tensor` (stable across ggml versions): type, buffer, ne, nb."""

    _fields_ = [
        ("type", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


GGML_TYPE_F32 = 0
LLAMA_CPP_VERSION: str = raw.__version__
# Saved sequence states are only valid for the llama.cpp build that wrote them.
STATE_FORMAT = f"llama-cpp-python-{LLAMA_CPP_VERSION}"


@cache
def backend_ready() -> bool:
    """Initialise llama.cpp's backends once per process."""
    raw.llama_backend_init()
    return True
