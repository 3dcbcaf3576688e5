"""On a GPU build of llama.cpp: the offloaded model gives the CPU's numbers, and every reading
kvchat makes of the cache (attention softmax, queries and keys under flash attention, sequence
states) works when the tensors live on the GPU.

Skipped on a CPU-only build such as CI's. On a CUDA build, `KVCHAT_TEST_GPU_LAYERS=99` also runs
the mechanics tests (test_mechanics, test_query_probe, …) on the GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.documents import load_document
from kvchat.events import Done
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel, gpu_offload_supported
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits

pytestmark = pytest.mark.skipif(not gpu_offload_supported(), reason="llama.cpp was built without GPU offload")

ALL_LAYERS = 99
WINDOW = 32


@pytest.fixture(scope="module")
def cpu_model(tiny_model_path: Path):
    with LlamaModel(tiny_model_path, gpu_layers=0) as model:
        yield model


@pytest.fixture(scope="module")
def gpu_model(tiny_model_path: Path):
    with LlamaModel(tiny_model_path, gpu_layers=ALL_LAYERS) as model:
        yield model


@pytest.fixture(scope="module")
def prompt(cpu_model) -> list[int]:
    rng = np.random.default_rng(7)
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "7", "42", "mat", "then"], size=400))
    return chat_tokens(cpu_model, [{"role": "user", "content": text}])[-600:]


def _cache(model: LlamaModel, flash_attn: bool = False) -> KvCache:
    return KvCache(LlamaContext(model, ContextSettings(n_ctx=2048, n_batch=256, threads=2, flash_attn=flash_attn)))


def _read_and_observe(model: LlamaModel, tokens: list[int], flash_attn: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The window's votes over the prompt and the cells SnapKV keeps from them."""
    cache = _cache(model, flash_attn)
    with cache.ctx:
        cache.decode(tokens[:-WINDOW])
        votes = cache.observe(tokens[-WINDOW:])
        policy = SnapKV(budget=128, window=WINDOW, spans="none")
        return votes, cache.plan(policy, WINDOW, votes).kept


def _logits_after(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    cache = _cache(model)
    with cache.ctx as ctx:
        cache.decode(tokens, want_logits=True)
        return last_logits(ctx)


def test_the_offloaded_model_gives_the_cpus_logits(cpu_model, gpu_model, prompt) -> None:
    on_cpu, on_gpu = _logits_after(cpu_model, prompt), _logits_after(gpu_model, prompt)
    worst = float(np.max(np.abs(on_cpu - on_gpu)))
    assert np.allclose(on_gpu, on_cpu, rtol=1e-2, atol=1e-2), f"largest difference {worst:.2e}"
    assert int(np.argmax(on_gpu)) == int(np.argmax(on_cpu))


def test_the_attention_read_on_the_gpu_matches_the_cpus(cpu_model, gpu_model, prompt) -> None:
    """kq_soft_max lives in GPU memory: the probe copies it out (ggml_backend_tensor_get)."""
    cpu_votes, cpu_kept = _read_and_observe(cpu_model, prompt)
    gpu_votes, gpu_kept = _read_and_observe(gpu_model, prompt)
    assert gpu_votes.shape == cpu_votes.shape
    np.testing.assert_allclose(gpu_votes, cpu_votes, rtol=1e-2, atol=1e-4)
    np.testing.assert_array_equal(gpu_kept, cpu_kept)


def test_flash_attention_scores_on_the_gpu_match_the_softmax(gpu_model, prompt) -> None:
    """With flash attention the scores come from the window's queries and the keys in the
    sequence state, which llama.cpp copies back from the GPU."""
    softmax_votes, softmax_kept = _read_and_observe(gpu_model, prompt, flash_attn=False)
    query_votes, query_kept = _read_and_observe(gpu_model, prompt, flash_attn=True)
    assert np.corrcoef(softmax_votes.ravel(), query_votes.ravel())[0, 1] > 0.999
    np.testing.assert_array_equal(query_kept, softmax_kept)


def test_a_state_saved_on_the_gpu_loads_on_the_cpu(cpu_model, gpu_model, prompt) -> None:
    """A saved reading is one format wherever it was read."""
    gpu_cache = _cache(gpu_model)
    with gpu_cache.ctx as gpu_ctx:
        gpu_cache.decode(prompt[:-1])
        saved = gpu_ctx.state_bytes(0)
    cpu_cache = _cache(cpu_model)
    with cpu_cache.ctx as cpu_ctx:
        cpu_ctx.load_state(saved, 0)
        cpu_ctx.decode([prompt[-1]], len(prompt) - 1)
        np.testing.assert_allclose(last_logits(cpu_ctx), _logits_after(cpu_model, prompt), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_an_answer_on_the_gpu_is_pruned_to_the_budget(tiny_model_path: Path, tmp_path: Path, flash_attn: bool) -> None:
    document = tmp_path / "notes.txt"
    document.write_text("The boat was named the Grey Heron. " * 80, encoding="utf-8")
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=8, layout=KvLayout(flash_attn=flash_attn))
    with Engine(str(tiny_model_path), gpu_layers=ALL_LAYERS, use_cache=False) as engine:
        events = list(engine.ask(load_document(document), "Boat?", settings))
    assert isinstance(events[-1], Done)
    stats = events[-1].stats
    assert stats.prompt_tokens > 600 and stats.kept_tokens == 64


def test_a_model_loads_on_the_gpu_after_bm25s_was_imported_first(tiny_model_path: Path) -> None:
    """bm25s's imports load libstdc++ for themselves; before kvchat made it global, a CUDA build's
    model loader then crashed (a segfault in print_info). A fresh process, imported in that order."""
    script = ("import bm25s\nfrom pathlib import Path\nfrom kvchat.llama import LlamaModel\n"
              f"with LlamaModel(Path({str(tiny_model_path)!r}), gpu_layers={ALL_LAYERS}) as model:\n"
              "    print(model.shape.n_layer)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().isdigit()
