"""The largest shape a model kvchat runs may declare. llama.cpp loads a GGUF whatever its
metadata says, then asserts (GGML_ASSERT, its backtrace on stdout) or overflows when a context
is made: a head 2^31 wide, a trained context of 2^32-1 (-1 as llama.cpp's int32). Each value is
checked at load, where a damaged or hostile file is refused in one line naming its key.
"""

from __future__ import annotations

from pathlib import Path

from kvchat.errors import ModelError

# far above any model released (heads to 256 wide, 128 of them, 16,384 wide, 126 layers, 10M tokens)
SHAPE_LIMITS = {
    "context_length": 2**24,
    "embedding_length": 2**16,
    "block_count": 2**12,
    "attention.head_count": 2**12,
    "attention.head_count_kv": 2**12,
    "attention.key_length": 2**12,
    "attention.value_length": 2**12,
}


def checked(path: Path, architecture: str, name: str, value: int) -> int:
    """`value` of the shape `name` (a key of SHAPE_LIMITS), or ModelError when it is out of bounds."""
    most = SHAPE_LIMITS[name]
    if not 1 <= value <= most:
        raise ModelError(f"{path}: {architecture}.{name} is {value:,}, not from 1 to {most:,}",
                         "the file's metadata is damaged: download the model again")
    return value
