"""llama.cpp's sampler chain: greedy at temperature 0, else top-k / top-p / min-p / temperature / dist."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvchat.errors import SettingsError
from kvchat.llama._lib import raw

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    def __post_init__(self) -> None:
        # The CLI, the TUI and the server all build these; hints name settings, not one front end's flags.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SettingsError(f"temperature must be 0 or more, got {self.temperature}", "use 0 for greedy answers, or a positive value to sample")
        if self.top_k < 0:
            raise SettingsError(f"top-k must be 0 or more, got {self.top_k}", "use 0 to consider every token, or e.g. 40")
        if not 0 < self.top_p <= 1:
            raise SettingsError(f"top-p must be above 0 and at most 1, got {self.top_p}", "use e.g. 0.95")
        if not 0 <= self.min_p <= 1:
            raise SettingsError(f"min-p must be between 0 and 1, got {self.min_p}", "use e.g. 0.05")


class Sampler:
    """Owns a `llama_sampler` chain; samples from the context's last logits."""

    def __init__(self, settings: SamplerSettings) -> None:
        self.settings = settings
        self._chain = raw.llama_sampler_chain_init(raw.llama_sampler_chain_default_params())
        for sampler in self._stages(settings):
            raw.llama_sampler_chain_add(self._chain, sampler)

    @staticmethod
    def _stages(settings: SamplerSettings) -> list[object]:
        if settings.temperature <= 0:
            return [raw.llama_sampler_init_greedy()]
        seed = DEFAULT_SEED if settings.seed is None else settings.seed & 0xFFFFFFFF
        return [
            raw.llama_sampler_init_top_k(settings.top_k),
            raw.llama_sampler_init_top_p(settings.top_p, 1),
            raw.llama_sampler_init_min_p(settings.min_p, 1),
            raw.llama_sampler_init_temp(settings.temperature),
            raw.llama_sampler_init_dist(seed),
        ]

    def sample(self, context_handle: object, row: int = -1) -> int:
        """Sample the next token from output row `row` (default: the last) and accept it."""
        return int(raw.llama_sampler_sample(self._chain, context_handle, row))

    def close(self) -> None:
        if self._chain:
            raw.llama_sampler_free(self._chain)
            self._chain = None
