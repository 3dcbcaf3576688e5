"""Options that `ask`, `chat` and `serve` share: where the model runs and how its KV cache is laid out."""

from __future__ import annotations

import typer
from rich.console import Console

from kvchat.engine import KvLayout
from kvchat.errors import SettingsError
from kvchat.llama import gpu_offload_supported

GPU_LAYERS = typer.Option(0, help="Layers to offload to the GPU (a CUDA or Metal build; see the README).")
FLASH_ATTN = typer.Option("auto", help="on, off, or auto (on with --gpu-layers); on: scores from queries and keys.")
CACHE_TYPE_K = typer.Option("f16", help="KV cache type of K: f16 or q8_0.")
CACHE_TYPE_V = typer.Option("f16", help="KV cache type of V: f16 or q8_0 (q8_0 needs flash attention).")


def flash_attention(choice: str, gpu_layers: int) -> bool:
    """--flash-attn on|off|auto; auto is on when layers run on a GPU (where the fused kernel
    saves memory and time) and off on the CPU (where reading the softmax is exact and cheaper)."""
    if choice not in ("on", "off", "auto"):
        raise SettingsError(f"unknown --flash-attn {choice!r}", "use on, off or auto")
    return choice == "on" or (choice == "auto" and gpu_layers > 0 and gpu_offload_supported())


def gpu_layers_warning(gpu_layers: int) -> str | None:
    """One line when --gpu-layers cannot take effect, which llama.cpp would not say."""
    if gpu_layers > 0 and not gpu_offload_supported():
        return (
            f"--gpu-layers {gpu_layers} has no effect: this llama-cpp-python build runs on the CPU only "
            "(reinstall it with CUDA or Metal: see the README's GPU section)"
        )
    return None


def warn_about_gpu_layers(gpu_layers: int, console: Console) -> None:
    if warning := gpu_layers_warning(gpu_layers):
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def kv_layout(flash_attn: str, gpu_layers: int, cache_type_k: str, cache_type_v: str) -> KvLayout:
    return KvLayout(flash_attention(flash_attn, gpu_layers), cache_type_k, cache_type_v)
