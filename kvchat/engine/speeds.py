"""How fast this machine reads with each model, remembered from real readings, so that a document's
reading time can be told before it is read (`kvchat inspect`)."""

from __future__ import annotations

import json
from pathlib import Path

from kvchat.atomic import atomic_file

MIN_MEASURED_TOKENS = 512  # a shorter reading says more about overheads than about speed


class ReadingSpeeds:
    """Tokens per second of the last reading long enough to measure, per model and per kind of
    reading ("read": whole, "stream": streamed), in one small JSON file. `model_key` names the
    model file and where it runs (a GPU reads many times faster)."""

    def __init__(self, path: Path, model_key: str) -> None:
        self.path = path
        self.model_key = model_key

    def _all(self) -> dict[str, dict[str, float]]:
        try:
            speeds = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none measured yet, or a file that is not ours
            return {}
        return speeds if isinstance(speeds, dict) else {}

    def record(self, kind: str, tokens: int, seconds: float) -> None:
        """Remember `tokens` read in `seconds`, if the reading was long enough to say anything."""
        if tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        speeds = self._all()
        speeds.setdefault(self.model_key, {})[kind] = round(tokens / seconds, 2)
        with atomic_file(self.path, "w") as out:
            json.dump(speeds, out, indent=1)

    def tokens_per_s(self, kind: str) -> float | None:
        """The last measured speed of `kind`, else of a whole reading, else None."""
        measured = self._all().get(self.model_key)
        if not isinstance(measured, dict):
            return None
        speed = measured.get(kind) or measured.get("read")
        return float(speed) if isinstance(speed, (int, float)) and speed > 0 else None
