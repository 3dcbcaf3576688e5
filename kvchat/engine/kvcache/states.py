"""Saved readings of documents for one model: keys, notices, and the store underneath."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from kvchat.engine.settings import AskSettings, KvLayout
from kvchat.engine.kvcache.store import DamagedState, StateStore, new_header
from kvchat.events import Event, Notice
from kvchat.llama import STATE_FORMAT

LOGGER = logging.getLogger(__name__)
WHOLE = ""  # the kind of a prompt's whole reading, the store's first: its keys name no kind


class DocumentStates:
    """Find and keep the full KV state of a read prompt prefix (a document with its template and
    system prompt, a chat's earlier messages), keyed by everything that shapes it: the model's
    sha256, the prefix's tokens, the KV cache layout and llama.cpp's state format."""

    def __init__(
        self, store: StateStore, model_sha256: str, model_name: str, layout: KvLayout = KvLayout()
    ) -> None:
        self.store = store
        self.model_sha256 = model_sha256
        self.model_name = model_name
        self.layout = layout

    def for_settings(self, settings: AskSettings) -> "DocumentStates":
        """The same store for the cache layout of `settings`: states of other layouts differ."""
        return DocumentStates(self.store, self.model_sha256, self.model_name, settings.layout)

    def key(self, prompt_sha256: str, kind: str = WHOLE) -> str:
        """`kind`: the reading's, where it is not the prompt's whole reading (a passage bank's)."""
        layout = self.layout
        material = f"{STATE_FORMAT}|{self.model_sha256}|{prompt_sha256}|{layout.type_k}"
        material += (f"|v={layout.type_v}" if layout.type_v != "f16" else "") + ("|flash-attn" if layout.flash_attn else "")
        return hashlib.sha256((material + (f"|{kind}" if kind else "")).encode()).hexdigest()[:40]

    def key_of(self, tokens: Sequence[int], kind: str = WHOLE) -> str:
        """What the reading of `tokens` is saved as (and locked as while it is read: in_progress.py)."""
        return self.key(tokens_sha256(tokens), kind)

    def has(self, tokens: Sequence[int], kind: str = WHOLE) -> bool:
        """Whether a reading of `tokens` is saved (it may still turn out damaged when loaded)."""
        return self.store.path_for(self.key_of(tokens, kind)).exists()

    def saved_lengths(self, at_most: int) -> list[int]:
        """Token counts of the saved readings, longest first (candidates for a prompt prefix)."""
        return sorted({entry.header.n_tokens for entry in self.store.entries() if entry.header.n_tokens <= at_most}, reverse=True)

    def load(self, tokens: Sequence[int], kind: str = WHOLE) -> Iterator[Event]:
        """The saved reading of `tokens`, or None; yields a Notice if a damaged one was found (and deleted)."""
        prompt_sha256 = tokens_sha256(tokens)
        try:
            found = self.store.load(self.key(prompt_sha256, kind), self.model_sha256, prompt_sha256)
        except DamagedState as damaged:
            yield _discarded(damaged.path, damaged.reason)
            return None
        except OSError as error:
            yield Notice(f"could not read the saved reading ({error.strerror}); reading the document again")
            return None
        if found is None:
            return None
        header, payload = found
        if header.n_tokens != len(tokens):
            yield Notice("a saved reading did not match the document; reading it again")
            return None
        return payload

    def discard(self, tokens: Sequence[int], reason: str, kind: str = WHOLE) -> Iterator[Event]:
        """Delete a saved reading that passed its checks but proved unusable (llama.cpp refused
        it), as a damaged one is: kept, it would fail every reading of the document."""
        path = self.store.path_for(self.key(tokens_sha256(tokens), kind))
        path.unlink(missing_ok=True)
        yield _discarded(path, reason)

    def save(self, tokens: Sequence[int], state: bytes, label: str, kind: str = WHOLE,
             checked_bytes: int | None = None) -> Iterator[Event]:
        """Save the reading of `tokens`; `label` (the document's path) is what `kvchat cache list` shows;
        `checked_bytes`: the first bytes of `state` its checksum covers, where its pieces carry their own."""
        prompt_sha256 = tokens_sha256(tokens)
        header = new_header(self.model_sha256, prompt_sha256, len(tokens), state, label, self.model_name, checked_bytes)
        try:
            self.store.save(self.key(prompt_sha256, kind), header, state)
        except OSError as error:
            LOGGER.warning("could not save state: %s", error)
            yield Notice(f"could not save the reading for next time ({error.strerror})")


def tokens_sha256(tokens: Sequence[int]) -> str:
    """What names a prompt prefix in the store: the sha256 of its token ids."""
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()


def _discarded(path: Path, reason: str) -> Notice:
    LOGGER.warning("discarded saved state %s: %s", path, reason)
    return Notice(f"a saved reading was damaged ({reason}); reading the document again")
