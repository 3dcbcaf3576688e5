"""How fast this machine reads with each model, remembered from real readings, so that a document's
reading time can be told before it is read (`kvchat inspect`).

The file is a memo: one that is not ours, or of the wrong shape (a list where a model's speeds
belong, a string where a number does), counts as nothing measured yet, and the next reading
writes it anew."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from kvchat.atomic import atomic_file, locked

LOGGER = logging.getLogger(__name__)
MIN_MEASURED_TOKENS = 512  # a shorter reading says more about overheads than about speed
PASSAGES_SPEED = "passages"  # a passage bank's reading (passage_bank.py), each passage alone


def _speed(value: object) -> float | None:
    """A measured speed, or None for anything that is not a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


class ReadingSpeeds:
    """Tokens per second of the last reading long enough to measure, per model and per kind of
    reading ("read": whole, "stream": streamed, PASSAGES_SPEED …), in one small JSON file. `model_key` names the
    model file and where it runs (a GPU reads many times faster)."""

    def __init__(self, path: Path, model_key: str) -> None:
        self.path = path
        self.model_key = model_key

    def _all(self) -> dict[str, dict[str, float]]:
        """Every model's speeds, only the entries of the right shape."""
        try:
            speeds = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # none measured yet, or a file that is not ours
            return {}
        if not isinstance(speeds, dict):
            return {}
        return {
            model: {kind: speed for kind, speed in measured.items() if _speed(speed) is not None}
            for model, measured in speeds.items()
            if isinstance(measured, dict)
        }

    def record(self, kind: str, tokens: int, seconds: float) -> None:
        """Remember `tokens` read in `seconds`, if the reading was long enough to say anything."""
        if tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        try:
            with locked(self.path):  # another process (a background reading) may record meanwhile
                speeds = self._all()
                speeds.setdefault(self.model_key, {})[kind] = round(tokens / seconds, 2)
                with atomic_file(self.path, "w") as out:
                    json.dump(speeds, out, indent=1)
        except OSError as error:  # a memo: the next reading measures again (a full disk)
            LOGGER.warning("could not remember the reading speed in %s: %s", self.path, error)

    def measured(self, kind: str) -> float | None:
        """The last measured speed of `kind` alone, or None."""
        return _speed(self._all().get(self.model_key, {}).get(kind))

    def tokens_per_s(self, kind: str) -> float | None:
        """The last measured speed of `kind`, else of a whole reading, else None."""
        measured = self._all().get(self.model_key, {})
        return _speed(measured.get(kind)) or _speed(measured.get("read"))
