"""Shared fixtures: an isolated KVCHAT_HOME, the tiny random GGUF, and the small real model; and the
suite's two tiers: plain `python -m pytest` runs the fast in-process tier, `--system` adds the
system tier (tests marked `system`: they start processes, drive tmux, Chromium or tesseract, run
the real model, or take more than a few seconds)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.tiny_gguf import write_tiny_gguf

try:  # rouge_score (L-Eval's metric) imports absl.logging, whose handler writes to, and at a logging
    # reconfiguration closes, the sys.stderr it found at import: under pytest, a capture's file, which a
    # later test then found closed. Given the process's own stderr, it never closes it.
    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__
except ImportError:
    pass

TESTS_DIR = Path(__file__).parent
REPO_DIR = TESTS_DIR.parent
# KVCHAT_TEST_GPU_LAYERS=99 runs the tiny-model mechanics with every layer on the GPU (a GPU build
# of llama.cpp): the same exact assertions then check the offloaded path. Unset, as in CI: the CPU.
TINY_GPU_LAYERS = int(os.environ.get("KVCHAT_TEST_GPU_LAYERS", "0"))
# The same tokens read in other batches give the same logits to float noise. On the CPU that is
# 1e-4. On the GPU, llama.cpp's CUDA kernels differ by batch size (a one-token decode is a
# matrix-vector product; a batch quantizes its activations for the matrix kernels), so the H200
# gave differences up to 5e-3 on logits of about 3: 1e-2, as the CPU-against-GPU test allows.
OTHER_BATCHES_TOLERANCE = 1e-2 if TINY_GPU_LAYERS else 1e-4
SYSTEM_DESELECTED = pytest.StashKey[int]()
RUN_ALL = "python -m pytest --system"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--system", action="store_true",
                     help="also run the system tier: tests that start processes, drive tmux, Chromium or "
                          "tesseract, run the real model, or are slow")


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--system"):
        return "tiers: fast and system"
    return f"tiers: fast only ({RUN_ALL} runs the system tier too)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test on the real model is in the system tier; without --system (or a -m of one's own)
    the system tier is deselected."""
    for item in items:
        if item.get_closest_marker("real_model") or "small_model_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.system)
    if config.getoption("--system") or config.getoption("markexpr"):
        return
    system = [item for item in items if item.get_closest_marker("system")]
    if system:
        config.hook.pytest_deselected(items=system)
        items[:] = [item for item in items if not item.get_closest_marker("system")]
    config.stash[SYSTEM_DESELECTED] = len(system)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if deselected := config.stash.get(SYSTEM_DESELECTED, 0):
        terminalreporter.write_line(f"fast tier only: {deselected} system-tier tests deselected; {RUN_ALL} runs all")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own KVCHAT_HOME except for the assembled small model (shared, see below)."""
    home = tmp_path_factory.mktemp("kvchat-home")
    monkeypatch.setenv("KVCHAT_HOME", str(home))
    monkeypatch.setenv("KVCHAT_KEEP_ALIVE", "0")  # an ask keeps no model loaded past its test (tests/cli/test_resident.py do)
    return home


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path):
    from kvchat.llama import LlamaModel

    with LlamaModel(tiny_model_path, gpu_layers=TINY_GPU_LAYERS) as model:
        yield model


@pytest.fixture(scope="session")
def wide_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with heads 32 wide, which q8_0's 32-value blocks fit (the usual one's are 16)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("wide") / "tiny-wide.gguf", n_embd=128)


@pytest.fixture(scope="session")
def wide_model(wide_model_path: Path):
    from kvchat.llama import LlamaModel

    with LlamaModel(wide_model_path, gpu_layers=TINY_GPU_LAYERS) as model:
        yield model


@pytest.fixture
def contexts_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The n_ctx of every llama.cpp context made from now on (a context grown is made anew)."""
    from kvchat.llama import LlamaContext

    made: list[int] = []
    init = LlamaContext.__init__

    def recording(self, model, settings) -> None:
        made.append(settings.n_ctx)
        init(self, model, settings)

    monkeypatch.setattr(LlamaContext, "__init__", recording)
    return made


@pytest.fixture(scope="session")
def small_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small real model (the tests are about mechanics; it runs them fastest), assembled once
    per test session from its installed PyPI parts."""
    from kvchat.models import find_entry
    from kvchat.models.fetch import assemble

    entry = find_entry("small")
    assert entry is not None
    if importlib.util.find_spec(entry.parts[0].module) is None:
        pytest.skip("the small model is not installed: pip install -e '.[test]'")
    target = tmp_path_factory.mktemp("models") / entry.filename
    assemble(entry, target)
    return target


@pytest.fixture(scope="session")
def real_engine(small_model_path: Path):
    from kvchat.engine import Engine

    with Engine(str(small_model_path), use_cache=False) as engine:
        yield engine
