"""GGUF models people already have, found where their tools keep them and never downloaded:
Ollama's store (`ollama:NAME[:TAG]`), LM Studio's folders (`lmstudio:PUBLISHER/MODEL[/FILE]`) and
the Hugging Face cache (`hf:ORG/REPO[:FILE-or-QUANT]`, read with huggingface_hub's scan_cache_dir).

Ollama keeps a manifest per name and tag (`manifests/registry.ollama.ai/library/qwen2.5/7b`), whose
model layer names a blob by its sha256 (`blobs/sha256-…`): the blob is the GGUF. LM Studio keeps
`PUBLISHER/MODEL/FILE.gguf` under `~/.lmstudio/models` (older versions: `~/.cache/lm-studio/models`).
"""

from __future__ import annotations

import json
import os
import re
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


from kvchat.errors import ModelError

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # a blob's name, `sha256-<hex>`, is made of it


@dataclass(frozen=True)
class FoundModel:
    name: str  # how --model names it: "ollama:qwen2.5:7b"
    path: Path
    source: str  # "ollama", "lmstudio"


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def lmstudio_roots() -> list[Path]:
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_cache() -> Path:
    """Where huggingface_hub keeps downloads (its HF_HUB_CACHE, HF_HOME, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def store_model(name: str) -> Path | None:
    """The GGUF a store name names; None for a name of no store (a registry name or a path).
    Raises ModelError, naming the command that downloads it, when the store lacks it."""
    source, _, rest = name.partition(":")
    if source == "ollama" and rest:
        return _ollama(rest)
    if source == "lmstudio" and rest:
        return _lmstudio(rest)
    if source == "hf" and rest:
        return _hugging_face(rest)
    return None


def _ollama(name: str) -> Path:
    model, _, tag = name.partition(":")
    tag = tag or "latest"
    namespace, _, short = model.rpartition("/")
    manifest = ollama_root() / "manifests" / OLLAMA_REGISTRY / (namespace or "library") / short / tag
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except FileNotFoundError:
        raise ModelError(f"no Ollama model {model}:{tag} in {ollama_root()}", f"ollama pull {model}:{tag}") from None
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        raise ModelError(f"Ollama's manifest of {model}:{tag} names no model file ({manifest})", f"ollama pull {model}:{tag}") from None
    if not isinstance(digest, str) or not OLLAMA_DIGEST.fullmatch(digest):  # "/etc/passwd" would leave blobs/
        raise ModelError(f"Ollama's manifest of {model}:{tag} names its model file by {reprlib.repr(digest)}, not by a sha256 "
                         f"({manifest})", f"ollama pull {model}:{tag}")
    blob = ollama_root() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise ModelError(f"Ollama's model file of {model}:{tag} is missing ({blob})", f"ollama pull {model}:{tag}")
    return blob


def _lmstudio(name: str) -> Path:
    parts = name.split("/")
    if len(parts) not in (2, 3):
        raise ModelError(f"lmstudio:{name} is not PUBLISHER/MODEL[/FILE]", "e.g. lmstudio:lmstudio-community/Qwen2.5-7B-Instruct-GGUF")
    for root in lmstudio_roots():
        folder = root / parts[0] / parts[1]
        files = sorted(folder.glob("*.gguf")) if len(parts) == 2 else [folder / parts[2]]
        files = [file for file in files if file.is_file() and "mmproj" not in file.name]
        if len(files) == 1:
            return files[0]
        if len(files) > 1:
            choices = ", ".join(f"lmstudio:{parts[0]}/{parts[1]}/{file.name}" for file in files)
            raise ModelError(f"lmstudio:{name} holds {len(files)} models", f"name one: {choices}")
    raise ModelError(f"no LM Studio model {name} in {' or '.join(map(str, lmstudio_roots()))}", f"lms get {parts[0]}/{parts[1]}")


def _hf_ggufs() -> dict[str, list[Path]]:
    """The GGUF files of each model repo in the Hugging Face cache, of its `main` revision (else
    its newest)."""
    if hf_cache_note() is not None:
        return {}
    from huggingface_hub import scan_cache_dir  # here: huggingface_hub takes a tenth of a second to import, which every kvchat ask would pay
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir(hf_cache()).repos
    except (CacheNotFound, ValueError, OSError):  # gone, or made a file, since; unreadable
        return {}
    found = {}
    for repo in sorted((repo for repo in repos if repo.repo_type == "model"), key=lambda repo: repo.repo_id):
        revisions = sorted(repo.revisions, key=lambda revision: ("main" in revision.refs, revision.last_modified))
        files = sorted(file.file_path for file in revisions[-1].files if file.file_name.endswith(".gguf")) if revisions else []
        if files := [path for path in files if "mmproj" not in path.name]:
            found[repo.repo_id] = files
    return found


def hf_cache_note() -> str | None:
    """Why the Hugging Face cache is left out, where it is there but is not a folder."""
    cache = hf_cache()
    if cache.exists() and not cache.is_dir():
        return f"the Hugging Face cache {cache} is not a folder: its models are left out (check HF_HUB_CACHE and HF_HOME)"
    return None


def _hugging_face(name: str) -> Path:
    repo, _, wanted = name.partition(":")
    download = f"huggingface-cli download {repo}" + (f" --include '*{wanted}*'" if wanted else "")
    files = _hf_ggufs().get(repo)
    if not files:
        raise ModelError(hf_cache_note() or f"no GGUF of {repo} in the Hugging Face cache ({hf_cache()})", download)
    chosen = [path for path in files if path.name == wanted] or [path for path in files if wanted.lower() in path.name.lower()]
    if len(chosen) == 1:
        return chosen[0]
    if not chosen:
        raise ModelError(f"no GGUF of {repo} matching {wanted!r} in the Hugging Face cache", download)
    choices = ", ".join(f"hf:{repo}:{path.name}" for path in chosen)
    raise ModelError(f"hf:{name} matches {len(chosen)} files", f"name one: {choices}")


def found_models() -> Iterator[FoundModel]:
    """Every model in the stores that are there (an absent store lists nothing)."""
    manifests = ollama_root() / "manifests" / OLLAMA_REGISTRY
    for manifest in sorted(manifests.glob("*/*/*")) if manifests.is_dir() else []:
        namespace, model, tag = manifest.relative_to(manifests).parts
        name = f"ollama:{model if namespace == 'library' else f'{namespace}/{model}'}:{tag}"
        try:
            yield FoundModel(name, _ollama(name.removeprefix("ollama:")), "ollama")
        except ModelError:
            continue  # a manifest of something that is not a model (an embedding's projector, a half pull)
    for root in lmstudio_roots():
        for path in sorted(root.glob("*/*/*.gguf")) if root.is_dir() else []:
            if "mmproj" not in path.name:
                publisher, model, file = path.relative_to(root).parts
                yield FoundModel(f"lmstudio:{publisher}/{model}/{file}", path, "lmstudio")
    for repo, files in _hf_ggufs().items():
        for path in files:
            yield FoundModel(f"hf:{repo}:{path.name}", path, "huggingface")
