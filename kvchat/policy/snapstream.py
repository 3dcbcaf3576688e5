"""SnapStream: SnapKV's selection applied while reading, so a document of any length is read
within budget + chunk cells (the engine's reading/chunked.py does the reading)."""

from __future__ import annotations

from dataclasses import dataclass

from kvchat.policy.snapkv import SnapKV


@dataclass(frozen=True)
class SnapStream(SnapKV):
    name = "snapstream"
    summary = "read within the budget"
    streams = True
