"""Saved document states: the full KV cache of a read document, on disk, verified on load.

One file per key: b"KVCHATST", u32 format version, u32 header length, a JSON header (model and
prompt hashes, token count, payload length, CRC-32), then llama.cpp's sequence state. Files are
written to a temp file and renamed, so concurrent writers of one key never leave a torn file; a
size cap evicts the least recently used. A damaged, truncated or foreign file (a header of the
wrong shape included) is deleted and reported, never loaded: by load() to its caller, by entries()
to the log. A writer killed mid-save leaves its temp file (the size of a whole reading); opening
the store removes those whose writer is gone, in any process (atomic.py: a live writer holds its
temp file's lock).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import reprlib
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from kvchat.atomic import TEMP_SUFFIX, atomic_file, remove_dead_temp_files

MAGIC = b"KVCHATST"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct("<8sII")
STATE_SUFFIX = ".kvstate"
DEFAULT_MAX_BYTES = 4 * 2**30
MAX_HEADER_BYTES = 2**20  # a header is a few hundred bytes; a longer one is not ours

LOGGER = logging.getLogger(__name__)


class DamagedState(Exception):
    """A saved state that must not be loaded; `reason` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path.name}: {reason}")
        self.path = path
        self.reason = reason


# The type of each field (created: a time, which JSON may write as an integer).
HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "model_sha256": str, "prompt_sha256": str, "n_tokens": int, "payload_bytes": int, "crc32": int,
    "document": str, "model": str, "created": (int, float), "checked_bytes": int,
}


@dataclass(frozen=True)
class StateHeader:
    model_sha256: str
    prompt_sha256: str
    n_tokens: int
    payload_bytes: int
    crc32: int
    document: str = ""
    model: str = ""
    created: float = 0.0
    # The payload's first bytes that crc32 covers, where not all of it: a passage bank's index,
    # which holds each piece's own checksum, checked as the piece is loaded (passage_bank.py).
    checked_bytes: int | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({name: value for name, value in self.__dict__.items() if value is not None}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: object) -> StateHeader:
        """The header `data` (parsed JSON) holds; ValueError unless it has every field, each of
        its type: a string where a count belongs would break whoever shows or compares it."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {reprlib.repr(data)}")
        for name, value in data.items():
            kind = HEADER_TYPES.get(name)
            if kind is None:
                raise ValueError(f"unknown field {reprlib.repr(name)}")
            if isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value < 0):
                raise ValueError(f"{name} is {reprlib.repr(value)}")
        try:
            return cls(**data)
        except TypeError as error:  # a field is missing
            raise ValueError(str(error)) from None


@dataclass(frozen=True)
class StoredState:
    path: Path
    header: StateHeader
    size: int
    last_used: float


def _read_header(path: Path, handle) -> StateHeader:
    preamble = handle.read(PREAMBLE.size)
    if len(preamble) < PREAMBLE.size:
        raise DamagedState(path, "truncated header")
    magic, version, header_len = PREAMBLE.unpack(preamble)
    if magic != MAGIC:
        raise DamagedState(path, "not a kvchat state file")
    if version != FORMAT_VERSION:
        raise DamagedState(path, f"format version {version}, expected {FORMAT_VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise DamagedState(path, f"a header of {header_len:,} bytes")
    try:
        return StateHeader.from_json(json.loads(handle.read(header_len)))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError; JSON nested too deep
        raise DamagedState(path, f"unreadable header ({error})") from None


class StateStore:
    """States under `root`, at most `max_bytes` in all (least recently used go first)."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        remove_dead_temp_files(root, f"*{STATE_SUFFIX}")

    def path_for(self, key: str) -> Path:
        return self.root / f"{key}{STATE_SUFFIX}"

    def load(self, key: str, model_sha256: str, prompt_sha256: str) -> tuple[StateHeader, memoryview] | None:
        """The state saved under `key`, or None if there is none. Raises DamagedState (after
        deleting the file) when it exists but must not be used.

        The payload is the file mapped copy-on-write, not read into a new buffer: a 16K-token
        state is ~200 MB and allocating plus copying it would cost more than the checksum.
        Writers replace files by rename, so the mapped file never changes underneath.
        """
        path = self.path_for(key)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            return None
        try:
            with handle:
                header = _read_header(path, handle)
                offset = handle.tell()
                if os.fstat(handle.fileno()).st_size - offset != header.payload_bytes:
                    raise DamagedState(path, "truncated or padded payload")
                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            payload = memoryview(mapped)[offset:]
            self._check(path, header, payload, model_sha256, prompt_sha256)
        except DamagedState:
            path.unlink(missing_ok=True)
            raise
        os.utime(path)
        return header, payload

    @staticmethod
    def _check(path: Path, header: StateHeader, payload: memoryview, model_sha256: str, prompt_sha256: str) -> None:
        if header.model_sha256 != model_sha256:
            raise DamagedState(path, "saved for another model")
        if header.prompt_sha256 != prompt_sha256:
            raise DamagedState(path, "saved for another document")
        checked = payload if header.checked_bytes is None else payload[: header.checked_bytes]
        if header.checked_bytes is not None and header.checked_bytes > len(payload) or zlib.crc32(checked) != header.crc32:
            raise DamagedState(path, "checksum mismatch")

    def save(self, key: str, header: StateHeader, payload: bytes) -> Path:
        """Write atomically (temp file + rename), then enforce the size cap."""
        target = self.path_for(key)
        header_bytes = header.to_bytes()
        with atomic_file(target) as out:
            out.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header_bytes)))
            out.write(header_bytes)
            out.write(payload)
        self._enforce_cap(keep=target)
        return target

    def entries(self) -> list[StoredState]:
        """Every readable state, most recently used first. A damaged one is deleted and logged
        (once: it is gone after), as load() would delete it."""
        found = []
        for path in self.root.glob(f"*{STATE_SUFFIX}") if self.root.is_dir() else []:
            try:
                with path.open("rb") as handle:
                    header = _read_header(path, handle)
                stat = path.stat()
            except DamagedState as damaged:
                LOGGER.warning("deleted a damaged saved reading: %s", damaged)
                path.unlink(missing_ok=True)
                continue
            except OSError:  # removed meanwhile (another process evicted it), or not ours to read
                continue
            found.append(StoredState(path, header, stat.st_size, stat.st_mtime))
        return sorted(found, key=lambda entry: entry.last_used, reverse=True)

    def clear(self) -> int:
        """Delete every saved state (and stray temp files); returns the bytes freed."""
        freed = 0
        for path in self.root.glob("*") if self.root.is_dir() else []:
            if path.name.endswith((STATE_SUFFIX, TEMP_SUFFIX)) and (stat := _stat(path)) is not None:
                freed += stat.st_size
                path.unlink(missing_ok=True)
        return freed

    def _enforce_cap(self, keep: Path) -> None:
        """Evict the least recently used states until all fit in max_bytes, `keep` aside. Other
        processes save and evict too: a file gone since the listing is not counted."""
        found = [(stat.st_mtime, stat.st_size, path) for path in self.root.glob(f"*{STATE_SUFFIX}")
                 if (stat := _stat(path)) is not None]
        total = sum(size for _, size, _ in found)
        for _, size, path in sorted(found):
            if total <= self.max_bytes:
                break
            if path != keep:
                total -= size
                path.unlink(missing_ok=True)


def _stat(path: Path) -> os.stat_result | None:
    """The file's stat, or None once another process removed it."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def new_header(model_sha256: str, prompt_sha256: str, n_tokens: int, payload: bytes, document: str, model: str,
               checked_bytes: int | None = None) -> StateHeader:
    """`checked_bytes`: the payload's first bytes its checksum covers (StateHeader), where not all."""
    return StateHeader(
        model_sha256=model_sha256,
        prompt_sha256=prompt_sha256,
        n_tokens=n_tokens,
        payload_bytes=len(payload),
        crc32=zlib.crc32(payload if checked_bytes is None else memoryview(payload)[:checked_bytes]),
        document=document,
        model=model,
        created=time.time(),
        checked_bytes=checked_bytes,
    )
