"""Block-wise reading of several documents: each read (or loaded) on its own after the prompt's
prefix, the readings put together in one cache, then the suffix, which sees them all.

A block does not see the others, so each block's reading is saved and loaded on its own (under
its label) and any combination of them is put together without reading again. Off by default
(composed.py): it answered worse than reading the documents as one text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.events import Event, Notice, Progress
from kvchat.llama import StateBytes


def read_blockwise(
    cache: KvCache,
    prefix: list[int],
    blocks: list[list[int]],
    suffix: list[int],
    states: DocumentStates | None,
    labels: list[str],
    cancel: threading.Event | None = None,
) -> Generator[Event, None, tuple[int, float]]:
    """Bring prefix + blocks + suffix into `cache` (the suffix is a few tokens: no progress).
    Returns the tokens loaded rather than read, and the seconds spent reading."""
    work = sum(len(prefix) + len(block) for block in blocks)  # what progress counts: each block's reading
    readings: list[StateBytes] = []
    loaded = done = 0
    read_s = 0.0
    for block, label in zip(blocks, labels):
        tokens = prefix + block
        found = (yield from states.load(tokens)) if states is not None else None
        if found is None:
            started = time.perf_counter()
            yield from _read_alone(cache, tokens, done, work, cancel)
            read_s += time.perf_counter() - started
            found = cache.state()
            if states is not None:
                yield from states.save(tokens, found, label)
        else:
            loaded += len(block) + (0 if readings else len(prefix))
            yield Notice(f"loaded the saved reading of {Path(label).name} ({len(tokens):,} tokens)")
        readings.append(found)
        done += len(tokens)
    first = np.asarray(prefix + blocks[0], dtype=np.int64)
    cache.load(readings[0], np.arange(len(first)), first)
    for block, reading in zip(blocks[1:], readings[1:]):
        cache.append_reading(reading, len(prefix), block)
    cache.decode(suffix)
    return loaded, read_s


def _read_alone(cache: KvCache, tokens: list[int], done: int, work: int, cancel: threading.Event | None) -> Iterator[Progress]:
    """Read `tokens` into the emptied cache: one block, after `done` of the `work`."""
    cache.clear()
    yield Progress(done=done, total=work, elapsed_s=0.0)
    yield from cache.prefill(tokens, done, work, cancel)
