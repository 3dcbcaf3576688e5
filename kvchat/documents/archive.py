"""Untrusted zip archives (a DOCX, an EPUB) read within the budgets of limits.py.

A zip bomb is a small file whose members unpack to gigabytes. Its directory is checked before
anything is inflated: how many members, the size each one declares and how hard it is compressed,
their total, and the compression method (stored or deflated: all that DOCX and EPUB use; bzip2
and LZMA members are inflated a whole chunk at a time, past any bound). Then members are inflated
in chunks, never more than a member declares plus one byte.

Why not ZipFile.read(): it hands a deflated member's compressed bytes to zlib in one call allowed
to return up to 2 GiB, and only then cuts the result at the declared size. A member that declares
1 KB and inflates to 2 GB costs the 2 GB before the CRC check refuses it. Read in chunks through
ZipFile.open(), with a copy of the member's entry that declares one byte more, it stops one byte
past a lie: zipfile returns no more than an entry declares and checks the CRC where it ends, which
refuses the lie there (as damaged); a CRC forged to match is refused by the count.
"""

from __future__ import annotations

import copy
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

from kvchat.documents import limits
from kvchat.documents.limits import ZIP_BOMB_HINT, size_text
from kvchat.errors import DocumentError

CHUNK_BYTES = 2**20
METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
NAME_CHARS = 80  # of a member's name quoted in an error


class Archive:
    """The zip `data` of `path`, a `kind` ("DOCX", "EPUB"), its directory checked. Raises
    DocumentError for a directory over the limits, zipfile.BadZipFile when `data` is not a zip."""

    def __init__(self, path: Path, data: bytes, kind: str) -> None:
        self.path, self.kind = path, kind
        self.inflated = 0  # bytes read() has returned, counted again for a member read again
        self._zip = zipfile.ZipFile(io.BytesIO(data))
        try:
            self._check_directory()
        except BaseException:
            self._zip.close()
            raise

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def namelist(self) -> list[str]:
        return self._zip.namelist()

    def read(self, name: str) -> bytes:
        """Member `name`, inflated within the budgets (KeyError if there is none, as ZipFile.read).
        Every read counts against MAX_ARCHIVE_BYTES: a book whose manifest lists one large member
        a hundred times is refused when the reads add up, not after."""
        info = self._zip.getinfo(name)
        self.inflated += info.file_size
        if self.inflated > limits.MAX_ARCHIVE_BYTES:
            raise self._bomb(f"reading the {self.kind} unpacks more than {size_text(limits.MAX_ARCHIVE_BYTES)}, "
                             f"the limit for an archive")
        return b"".join(self._inflate(info))

    def verify(self) -> None:
        """Inflate every member once and discard it: after this a library that reads the archive
        itself with ZipFile.read() (python-docx) gets exactly the declared sizes, which the
        directory check bounded."""
        for info in self._zip.infolist():
            for _chunk in self._inflate(info):
                pass

    def _check_directory(self) -> None:
        infos = self._zip.infolist()
        kind = self.kind
        if len(infos) > limits.MAX_ARCHIVE_MEMBERS:
            raise self._bomb(f"the {kind} holds {len(infos):,} files, over the limit of "
                             f"{limits.MAX_ARCHIVE_MEMBERS:,} for an archive")
        for info in infos:
            if info.compress_type not in METHODS:
                raise DocumentError(
                    f"{self.path}: not a readable {kind} (part {_name(info)} is compressed with method "
                    f"{info.compress_type}, not stored or deflated as in every DOCX and EPUB)",
                    "is the file what it claims to be? Save it again from its application",
                )
            if info.file_size > limits.MAX_MEMBER_BYTES:
                raise self._bomb(f"part {_name(info)} of the {kind} unpacks to {size_text(info.file_size)}, "
                                 f"over the limit of {size_text(limits.MAX_MEMBER_BYTES)} for one part")
            ratio = info.file_size / max(info.compress_size, 1)
            if info.file_size > limits.RATIO_FLOOR_BYTES and ratio > limits.MAX_COMPRESSION_RATIO:
                raise self._bomb(f"part {_name(info)} of the {kind} is compressed {ratio:,.0f} to 1, over the limit "
                                 f"of {limits.MAX_COMPRESSION_RATIO:,} to 1")
        total = sum(info.file_size for info in infos)
        if total > limits.MAX_ARCHIVE_BYTES:
            raise self._bomb(f"the {kind} unpacks to {size_text(total)}, over the limit of "
                             f"{size_text(limits.MAX_ARCHIVE_BYTES)} for an archive")

    def _inflate(self, info: zipfile.ZipInfo) -> Iterator[bytes]:
        """Member `info` in chunks; refused one byte past its declared size (see the module's doc)."""
        probe = copy.copy(info)
        probe.file_size = info.file_size + 1
        inflated = 0
        with self._zip.open(probe) as member:
            while chunk := member.read(CHUNK_BYTES):
                inflated += len(chunk)
                if inflated > info.file_size:
                    raise self._bomb(f"part {_name(info)} of the {self.kind} unpacks to more than the "
                                     f"{size_text(info.file_size)} its directory declares")
                yield chunk

    def _bomb(self, what: str) -> DocumentError:
        return DocumentError(f"{self.path}: {what} (a zip bomb?)", ZIP_BOMB_HINT)


def _name(info: zipfile.ZipInfo) -> str:
    """A member's name as an error quotes it: its first NAME_CHARS characters, control characters escaped."""
    name = info.filename
    return repr(name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "…")
