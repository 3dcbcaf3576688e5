"""Saved document states on the tiny model: round trip, damage detection, concurrency, LRU."""

from __future__ import annotations

import errno
import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from kvchat.atomic import atomic_file
from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation, Engine, WholeReadingDone
from kvchat.engine.kvcache import in_progress
from kvchat.engine.kvcache.in_progress import ReadingsInProgress
from kvchat.engine.kvcache.states import DocumentStates, tokens_sha256
from kvchat.engine.kvcache.store import STATE_SUFFIX, DamagedState, StateStore, new_header
from kvchat.engine.answering import route
from kvchat.events import Done, Notice, Progress
from kvchat.llama import LlamaModel
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits

SETTINGS = AskSettings(method=SnapKV(budget=96, window=16), max_tokens=8, threads=2)


@pytest.fixture
def document(tmp_path: Path) -> Document:
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(60))
    return Document(path=tmp_path / "boxes.txt", kind="text", text=text)


def states_for(root: Path, model_sha: str = "a" * 64, max_bytes: int = 2**30) -> DocumentStates:
    return DocumentStates(StateStore(root, max_bytes), model_sha, "tiny")


def open_conversation(model, document, states) -> tuple[Conversation, list]:
    conversation = Conversation(model, "tiny", document, SETTINGS, states=states)
    return conversation, list(conversation.open())


def next_logits(conversation: Conversation) -> np.ndarray:
    ctx = conversation.run.cache.ctx
    ctx.decode([7], len(conversation.document_tokens))
    return last_logits(ctx)


def test_save_then_load_gives_identical_logits(tiny_model, document, tmp_path) -> None:
    states = states_for(tmp_path / "states")
    first, events = open_conversation(tiny_model, document, states)
    assert any(isinstance(e, Progress) and e.done > 0 for e in events)
    with_read = next_logits(first)
    first.close()
    second, events = open_conversation(tiny_model, document, states)
    assert [e for e in events if isinstance(e, Notice)][0].text.startswith("loaded the saved reading")
    assert not any(isinstance(e, Progress) and e.done > 0 for e in events)
    assert np.array_equal(next_logits(second), with_read)
    second.close()



def test_on_a_gpu_the_defaults_read_the_document_again_for_its_whole_cache_and_save_nothing(
    tiny_model, document, tmp_path, monkeypatch,
) -> None:
    """Reading again is sooner there than loading a saved reading (ways' decision: sizing.answers_whole_on_gpu)."""
    monkeypatch.setattr(LlamaModel, "on_gpu", True)
    states = states_for(tmp_path / "states")
    for _ in range(2):
        conversation = Conversation(tiny_model, "tiny", document, AskSettings(max_tokens=8, threads=2), states=states)
        events = list(conversation.open())
        read = [event for event in events if isinstance(event, Progress)][-1]
        assert (conversation.settings.method.name, read.read_from, read.done) == ("full", 0, len(conversation.document_tokens))
        assert not [event for event in events if isinstance(event, Notice)]  # nothing loaded
        conversation.close()
    assert not list((tmp_path / "states").rglob(f"*{STATE_SUFFIX}"))


def test_a_whole_reading_awaits_another_processs_reading_of_the_document_and_loads_it(
    tiny_model, document, tmp_path, monkeypatch,
) -> None:
    """Two `kvchat ask` at once about one new document: the second awaits the first's whole reading
    and loads it, as it awaits a background reading, rather than reading the document beside it."""
    states = states_for(tmp_path / "states")
    waiting = Conversation(tiny_model, "tiny", document, SETTINGS, states=states, in_progress=ReadingsInProgress(tmp_path / "reading"))
    elsewhere = ReadingsInProgress(tmp_path / "reading")
    claim = elsewhere.claim(waiting.reading_key, str(document.path), "tiny", len(waiting.document_tokens))
    assert claim is not None  # held here, as process 4242 holds it: it reads the document whole
    record = tmp_path / "reading" / f"{waiting.reading_key}.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "pid": 4242}))
    monkeypatch.setattr(in_progress, "holders", lambda path: {4242})
    opening = waiting.open()
    assert next(opening) == Notice(f"another kvchat process is reading {document.path}; waiting for it")
    other, _ = open_conversation(tiny_model, document, states)  # its reading, saved
    other.close()
    claim.release()
    rest = list(opening)
    assert [event.text for event in rest if isinstance(event, Notice)][0].startswith("loaded the saved reading")
    assert not any(isinstance(event, Progress) and event.done > 0 for event in rest)  # nothing read here
    waiting.close()


def test_a_whole_reading_that_could_not_be_saved_is_no_reading_done(tiny_model_path, document, monkeypatch) -> None:
    """`kvchat read` on a full disk: its only purpose failed (cli/read.py exits 1 on it)."""
    def full(self, key, header, payload) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StateStore, "save", full)
    with Engine(str(tiny_model_path)) as engine:
        reading = engine.read_whole(document, SETTINGS)
        events = []
        while True:
            try:
                events.append(next(reading))
            except StopIteration as finished:
                how = finished.value
                break
    assert how is WholeReadingDone.UNSAVED
    assert Notice("could not save the reading for next time (No space left on device)") in events

def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    elif how == "truncated":
        data = data[: len(data) - 1000]
    elif how == "garbage":
        data = bytearray(b"not a state at all")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "garbage", "other model"])
def test_damaged_state_is_rejected_once_and_recomputed(tiny_model, document, tmp_path, how) -> None:
    root = tmp_path / "states"
    conversation, _ = open_conversation(tiny_model, document, states_for(root))
    conversation.close()
    (saved,) = list(root.glob("*.kvstate"))
    if how == "other model":
        other = states_for(root, model_sha="b" * 64)
        saved.rename(other.store.path_for(other.key(tokens_sha256(conversation.document_tokens))))
        states = other
    else:
        _damage(saved, how)
        states = states_for(root)
    again, events = open_conversation(tiny_model, document, states)
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "damaged" in notices[0]
    assert any(isinstance(e, Progress) and e.done == len(again.document_tokens) for e in events)
    answer = list(route.answer(again, "What is the code for box 7?"))[-1]
    assert isinstance(answer, Done)
    again.close()
    third, events = open_conversation(tiny_model, document, states)  # the recomputed state is sound
    assert [e.text for e in events if isinstance(e, Notice)][0].startswith("loaded")
    third.close()


@pytest.mark.parametrize("how", ["truncated", "foreign bytes"])
def test_state_llama_cpp_refuses_is_deleted_and_read_again(tiny_model, document, tmp_path, how) -> None:
    """A saved reading with a sound checksum that llama.cpp will not restore is handled as a
    damaged one: deleted with one notice, the document read again, the new reading saved."""
    states = states_for(tmp_path / "states")
    first, _ = open_conversation(tiny_model, document, states)
    first.close()
    document_sha256 = tokens_sha256(first.document_tokens)
    key = states.key(document_sha256)
    sound = bytes(states.store.load(key, states.model_sha256, document_sha256)[1])
    refused = sound[: len(sound) // 2] if how == "truncated" else bytes(range(256)) * (len(sound) // 256)
    list(states.save(first.document_tokens, refused, "boxes.txt"))  # re-checksummed
    for expected in ("damaged (llama.cpp refused it)", "loaded the saved reading"):
        conversation, events = open_conversation(tiny_model, document, states)
        assert [expected in e.text for e in events if isinstance(e, Notice)] == [True]
        assert isinstance(list(route.answer(conversation, "What is the code for box 7?"))[-1], Done)
        conversation.close()
        replaced = states.store.load(key, states.model_sha256, document_sha256)[1]
        assert bytes(replaced) == sound  # read again from scratch: nothing of the refused state left


def _write_many(root: str, worker: int) -> None:
    store = StateStore(Path(root))
    for round_ in range(15):
        payload = bytes([worker]) * (200_000 + round_)
        store.save("shared-key", new_header("m", "p", 10, payload, "doc", "tiny"), payload)


@pytest.mark.system
def test_concurrent_writers_never_tear_a_file(tmp_path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_write_many, args=(str(tmp_path), w)) for w in range(1, 5)]
    for worker in workers:
        worker.start()
    store = StateStore(tmp_path)
    loads = 0
    while any(w.is_alive() for w in workers):
        found = store.load("shared-key", "m", "p")
        if found is not None:
            header, payload = found
            assert len(set(payload)) == 1 and len(payload) == header.payload_bytes
            loads += 1
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert store.load("shared-key", "m", "p") is not None
    assert [p.name for p in tmp_path.iterdir()] == ["shared-key.kvstate"]


def test_size_cap_evicts_least_recently_used(tmp_path) -> None:
    import os
    import time

    store = StateStore(tmp_path, max_bytes=2_500_000)
    for index, key in enumerate(["a", "b", "c"]):
        payload = bytes([index]) * 1_000_000
        store.save(key, new_header("m", key, 1, payload, key, "tiny"), payload)
        os.utime(store.path_for(key), (time.time() - 100 + index * 10,) * 2)
        if key == "b":
            assert store.load("a", "m", "a") is not None  # "a" is now the most recently used
    assert store.path_for("a").exists() and store.path_for("c").exists()
    assert not store.path_for("b").exists()
    assert [e.header.document for e in store.entries()] == ["a", "c"]
    assert store.clear() > 0 and store.entries() == []


def test_a_state_another_process_evicted_meanwhile_does_not_fail_a_save_or_a_clear(tmp_path, monkeypatch) -> None:
    store = StateStore(tmp_path, max_bytes=1_500_000)
    payload = bytes(1_000_000)
    store.save("old", new_header("m", "old", 1, payload, "old", "tiny"), payload)
    listing = Path.glob

    def listing_with_a_file_gone(self: Path, pattern: str):
        yield from listing(self, pattern)
        yield self / f"evicted-by-another-process{STATE_SUFFIX}"  # listed, then removed before its stat

    monkeypatch.setattr(Path, "glob", listing_with_a_file_gone)
    saved = store.save("new", new_header("m", "new", 1, payload, "new", "tiny"), payload)  # the cap evicts "old"
    assert saved.exists() and not store.path_for("old").exists()
    size = saved.stat().st_size
    assert store.clear() == size and not saved.exists()


def test_store_rejects_wrong_prompt(tmp_path) -> None:
    store = StateStore(tmp_path)
    store.save("k", new_header("m", "p", 1, b"xyz", "doc", "tiny"), b"xyz")
    with pytest.raises(DamagedState, match="another document"):
        store.load("k", "m", "other")
    assert not store.path_for("k").exists()


def test_opening_the_store_removes_a_dead_writers_temp_file_and_keeps_a_live_ones(tmp_path) -> None:
    store = StateStore(tmp_path)
    store.save("k", new_header("m", "p", 1, b"xyz", "doc", "tiny"), b"xyz")
    saved = store.path_for("k").read_bytes()
    dead = tmp_path / "k.kvstate.killed9.tmp"  # a writer killed mid-save a moment ago: no lock held on it
    dead.write_bytes(b"half a state")
    odd = tmp_path / "k.kvstate.odd.tmp"
    odd.mkdir()  # not a temp file of ours: left alone
    with atomic_file(store.path_for("j")) as live:  # a save under way (its lock held, as in any process)
        live.write(b"half")
        StateStore(tmp_path)
        writing = [path.name for path in tmp_path.glob("j.kvstate.*.tmp")]
        assert len(writing) == 1 and not dead.exists() and odd.is_dir()
    assert store.path_for("j").read_bytes() == b"half"  # the live save went on to its rename
    assert store.path_for("k").read_bytes() == saved
    assert [e.header.document for e in store.entries()] == ["doc"]