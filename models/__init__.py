"""The model registry (models shipped as PyPI data packages) and their assembly into GGUF files."""

from kvchat.models.fetch import ModelStatus, model_sha256, model_status, resolve_model
from kvchat.models.registry import REGISTRY, ModelEntry, find_entry

__all__ = ["REGISTRY", "ModelEntry", "ModelStatus", "find_entry", "model_sha256", "model_status", "resolve_model"]
