"""The model registry (models shipped as PyPI data packages) and their assembly into GGUF files."""

from kvchat.models.fetch import ModelStatus, file_sha256, installed_draft, model_sha256, model_status, resolve_model
from kvchat.models.registry import REGISTRY, ModelEntry, cheap_depth, find_entry
from kvchat.models.stores import FoundModel, found_models, hf_cache_note

__all__ = [
    "REGISTRY", "FoundModel", "ModelEntry", "ModelStatus", "found_models", "cheap_depth", "hf_cache_note", "file_sha256", "find_entry", "installed_draft", "model_sha256", "model_status",
    "resolve_model",
]
