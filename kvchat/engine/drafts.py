"""Which installed model does the cheap pass of a model's fast readings (its draft): the
registry's pair for a registry model; for any other GGUF (a path, an Ollama or LM Studio model)
an installed registry model that is smaller and has exactly the same vocabulary, as Speculative
Prefill needs. The vocabulary check loads both models (a few seconds), so its answer is
remembered per model file (path, size and modification time) in the cache directory. A draft is
loaded the first time a cheap pass needs it (Draft)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from kvchat.atomic import atomic_file, locked
from kvchat.errors import CancelledError, ModelError, SettingsError
from kvchat.llama import LlamaModel
from kvchat.models import REGISTRY, find_entry, installed_draft, model_status, resolve_model
from kvchat.paths import cache_dir

MEMO_NAME = "draft-pairs.json"
NO_DRAFT = "none"  # the `draft` setting's word for none: a fast reading's cheap pass is the model's own first layers
LOGGER = logging.getLogger(__name__)


def paired_draft(name: str) -> str | None:
    """The draft for the model `name` (registry name, path or store name), or None; also None for
    a model not found (loading it says why, after the documents are read)."""
    if find_entry(name) is not None:
        return installed_draft(name)
    try:
        path = resolve_model(name)
    except ModelError:
        return None
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_path = cache_dir() / MEMO_NAME
    if key in (memo := _memo(memo_path)):
        return memo[key] or None
    draft = _same_vocabulary(path, stat.st_size)
    try:
        with locked(memo_path):
            memo = _memo(memo_path)
            memo[key] = draft or ""
            with atomic_file(memo_path, "w") as out:
                json.dump(memo, out)
    except OSError as error:  # a memo: looked up again next time (a read-only KVCHAT_HOME, `cache` off)
        LOGGER.warning("could not remember the draft in %s: %s", memo_path, error)
    return draft


def draft_for(model: str, draft: str | None, read: str) -> str | None:
    """The draft an engine loads for fast readings, for every command alike: the one the `draft`
    setting names, none for NO_DRAFT, else (unless the reading is full) the registry's pair for
    `model` (small, for the default model) if installed."""
    if draft == NO_DRAFT:
        return None
    if draft is not None:
        return draft
    return paired_draft(model) if read != "full" else None


def draft_at_start(draft: str | None, read: str) -> bool:
    """Whether an engine loads its draft at start (Engine's `draft_at_start`): one the user named,
    to be refused at once if its vocabulary is not the model's, and one that every question of a
    fast reading needs. The model's own pair waits for the first question whose words choose
    nothing, which the defaults rarely meet."""
    return draft is not None or read == "fast"


class Draft:
    """The draft `name` of `model`, loaded at the first model() call: at start (Engine's
    `draft_at_start`), or once a cheap pass needs it. The defaults choose by the question's words
    and ask a draft's attention only where those find nothing, so most runs never need it; loading
    it and checking its vocabulary took 1.7 s here on 2 cores. Refused, in one line, where its
    vocabulary is not the model's."""

    def __init__(self, name: str, path: Path, model: LlamaModel, gpu_layers: int = 0) -> None:
        self.name, self.path = name, path
        self._drafts_for, self._gpu_layers = model, gpu_layers
        self._loaded: LlamaModel | None = None
        self._closed = False  # with its engine: the model it drafts for is closed too
        self._lock = threading.Lock()  # a chat's question and its background reading run on two threads

    def model(self) -> LlamaModel:
        """The draft, loaded and its vocabulary checked on the first call."""
        with self._lock:
            if self._closed:
                raise CancelledError(f"the draft {self.name} was closed with its engine")
            if self._loaded is None:
                draft = LlamaModel(self.path, gpu_layers=self._gpu_layers)
                try:
                    if not self._drafts_for.same_vocabulary(draft):
                        raise SettingsError(f"the draft model {self.name} has another vocabulary than the model",
                                            "use a smaller model of the same family (the default model's draft is small)")
                except BaseException:
                    draft.close()
                    raise
                self._loaded = draft
            return self._loaded

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._loaded is not None:
                self._loaded.close()
                self._loaded = None


def _same_vocabulary(path: Path, size: int) -> str | None:
    """The smallest installed registry model smaller than the model at `path` with its vocabulary."""
    installed = [entry for entry in REGISTRY if entry.size < size and model_status(entry).packages_installed]
    if not installed:
        return None
    with LlamaModel(path) as model:
        for entry in sorted(installed, key=lambda each: each.size):
            with LlamaModel(resolve_model(entry.name)) as draft:
                if model.same_vocabulary(draft):
                    return entry.name
    return None


def _memo(path: Path) -> dict[str, str]:
    try:
        memo = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {key: value for key, value in memo.items() if isinstance(value, str)} if isinstance(memo, dict) else {}
