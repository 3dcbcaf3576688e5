"""The files that the paths named to `kvchat ask` and `kvchat read` stand for: files, folders' documents,
and globs the shell did not expand, each file once."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

from kvchat.documents import DOCUMENT_SUFFIXES, STDIN, SUPPORTED


def files_named(paths: list[str]) -> Iterator[tuple[Path, str | None]]:
    """Each file `paths` name, with why it is skipped (None: to read). A folder gives its
    documents (the suffixes a file picker offers, hidden files left out), a glob its matches
    (the shell's, when it did not expand it), a file itself. A file named twice (`a.txt ./a.txt`,
    a file and a glob matching it, a link to it) comes once, where it was first named."""
    seen: set[str] = set()
    for name in paths:
        for path, skipped in _files_of(name):
            identity = name if name == STDIN else os.path.realpath(path)
            if identity not in seen:
                seen.add(identity)
                yield path, skipped


def _files_of(name: str) -> Iterator[tuple[Path, str | None]]:
    matches = _glob(name) if glob.has_magic(name) and not os.path.lexists(name) else [Path(name)]  # `a[1].txt` is a name
    if not matches:
        yield Path(name), "no file matches it"
    for match in matches:
        if not match.is_dir():
            yield match, None
            continue
        for path in sorted(match.rglob("*")):  # rglob does not enter linked folders
            if path.is_dir() or _hidden(path.relative_to(match)):
                continue
            yield path, None if path.suffix.lower() in DOCUMENT_SUFFIXES else f"not a {SUPPORTED} file"


def _glob(pattern: str) -> list[Path]:
    """What `pattern` matches, as a shell's glob with `**` would, hidden files left out, except
    that `**` never enters a linked folder: glob.glob follows them, and a link to its own folder
    (`ln -s . self`) makes it list each file once per path through the loop, or never end."""
    path = Path(pattern)
    parts = path.parts[1:] if path.anchor else path.parts
    fixed = next((index for index, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    base = Path(path.anchor or ".").joinpath(*parts[:fixed])
    relative = "/".join(parts[fixed:])
    asks_hidden = any(part.startswith(".") for part in parts[fixed:])  # `.*`, `**/.env`
    return sorted(match for match in base.glob(relative) if asks_hidden or not _hidden(match.relative_to(base)))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)
