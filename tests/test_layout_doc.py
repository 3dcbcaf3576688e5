"""docs/layout.md's "## Layout" names every module of the code by its path from the repository root
(in backticks), and every `.py` path it names exists, so a new, moved or renamed module is noticed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).parents[1]
CODE = ("kvchat", "cli", "tui", "server", "models")


def modules() -> list[str]:
    """The code's modules (git's tracked files; the folders walked where there is no git), less `__init__.py`."""
    try:
        listed = subprocess.run(["git", "ls-files", *(f"{room}/*.py" for room in CODE)], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = [path.relative_to(REPO).as_posix() for room in CODE for path in (REPO / room).rglob("*.py")]
    return sorted(path for path in listed if not path.endswith("/__init__.py"))


def layout_section() -> str:
    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    return text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]


def test_every_module_has_its_line() -> None:
    named = set(re.findall(r"`([^`\s]+)`", layout_section()))
    missing = [path for path in modules() if path not in named]
    assert len(modules()) > 100
    assert not missing, "docs/layout.md has no line for: " + ", ".join(missing)


def test_every_module_it_names_exists() -> None:
    gone = [path for path in re.findall(r"`([^`\s]+\.py)`", layout_section()) if not (REPO / path).is_file()]
    assert not gone, "docs/layout.md names modules that do not exist: " + ", ".join(gone)
