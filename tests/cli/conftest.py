"""The CLI tests' document: a short text of numbered items."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def document(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(120)))
    return path
