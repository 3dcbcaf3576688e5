"""Cache and memo files of the wrong shape (valid JSON of the wrong type, a saved reading whose
header holds a string where a count belongs) are treated as damaged ones: reported once, deleted or
rebuilt, never a traceback."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvchat.cli.logs import LOG_FILE_NAME
from kvchat.engine.reading.speeds import MIN_MEASURED_TOKENS, ReadingSpeeds
from kvchat.engine.kvcache.store import FORMAT_VERSION, MAGIC, DamagedState, StateStore, new_header
from kvchat.models.fetch import model_sha256
from kvchat.paths import log_dir

# ---- model-sha256.json -----------------------------------------------------------------------------


@pytest.mark.parametrize("memo", ["[]", '"str"', "null", "12", "{not json", '{"KEY": 5}', '{"KEY": "not a digest"}'])
def test_a_sha256_memo_of_the_wrong_shape_is_rebuilt(memo: str, tmp_path: Path, isolated_home: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF and some weights")
    stat = model.stat()
    key = f"{model.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_path = isolated_home / "cache" / "model-sha256.json"
    memo_path.parent.mkdir(parents=True)
    memo_path.write_text(memo.replace("KEY", key.replace("\\", "\\\\")))
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert model_sha256(model) == digest
    assert json.loads(memo_path.read_text()) == {key: digest}  # rebuilt: the next command finds it
    assert model_sha256(model) == digest


def test_the_other_digests_of_a_sha256_memo_are_kept(tmp_path: Path, isolated_home: Path) -> None:
    memo_path = isolated_home / "cache" / "model-sha256.json"
    memo_path.parent.mkdir(parents=True)
    memo_path.write_text(json.dumps({"/other.gguf|1|2": "a" * 64, "/bad.gguf|1|2": ["a"]}))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    model_sha256(model)
    assert json.loads(memo_path.read_text())["/other.gguf|1|2"] == "a" * 64 and len(json.loads(memo_path.read_text())) == 2


# ---- reading-speeds.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    ["[]", "null", '{"KEY": [400]}', '{"KEY": "fast"}', '{"KEY": {"read": [400], "stream": "fast"}}',
     '{"KEY": {"read": true}}', '{"KEY": {"read": -5}}', '{"KEY": {"read": Infinity}}', "{not json"],
)
def test_reading_speeds_of_the_wrong_shape_count_as_none_measured(content: str, tmp_path: Path) -> None:
    path = tmp_path / "reading-speeds.json"
    path.write_text(content.replace("KEY", "model|gpu_layers=0"))
    speeds = ReadingSpeeds(path, "model|gpu_layers=0")
    assert speeds.tokens_per_s("read") is None and speeds.tokens_per_s("stream") is None
    speeds.record("read", MIN_MEASURED_TOKENS * 2, 2.0)  # the next reading writes it anew
    assert speeds.tokens_per_s("stream") == speeds.tokens_per_s("read") == MIN_MEASURED_TOKENS
    assert json.loads(path.read_text())["model|gpu_layers=0"] == {"read": MIN_MEASURED_TOKENS}


def test_the_other_models_speeds_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "reading-speeds.json"
    path.write_text(json.dumps({"other": {"read": 300.0}, "model": [1]}))
    ReadingSpeeds(path, "model").record("stream", MIN_MEASURED_TOKENS, 1.0)
    assert json.loads(path.read_text()) == {"other": {"read": 300.0}, "model": {"stream": MIN_MEASURED_TOKENS}}


# ---- saved readings --------------------------------------------------------------------------------

HEADER = {"model_sha256": "m" * 64, "prompt_sha256": "p" * 64, "n_tokens": 5, "payload_bytes": 3, "crc32": 1,
          "document": "notes.txt", "model": "tiny", "created": 1.0}


def write_state(path: Path, header: object, payload: bytes = b"xyz") -> Path:
    """A saved reading with a valid magic and version and `header` as its JSON header."""
    body = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<8sII", MAGIC, FORMAT_VERSION, len(body)) + body + payload)
    return path


WRONG_HEADERS = {
    "n_tokens-a-string": {**HEADER, "n_tokens": "lots"},
    "n_tokens-null": {**HEADER, "n_tokens": None},
    "n_tokens-negative": {**HEADER, "n_tokens": -1},
    "n_tokens-true": {**HEADER, "n_tokens": True},
    "document-a-number": {**HEADER, "document": 12345},
    "model-a-list": {**HEADER, "model": ["tiny"]},
    "crc32-a-float": {**HEADER, "crc32": 1.5},
    "a-field-missing": {key: value for key, value in HEADER.items() if key != "payload_bytes"},
    "an-unknown-field": {**HEADER, "extra": 1},
    "a-list": [1, 2],
    "null": None,
}


@pytest.mark.parametrize("kind", sorted(WRONG_HEADERS))
def test_a_saved_reading_with_a_header_of_the_wrong_shape_is_damaged(kind: str, tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    write_state(store.path_for("k"), WRONG_HEADERS[kind])
    with pytest.raises(DamagedState, match="unreadable header"):
        store.load("k", "m" * 64, "p" * 64)
    assert not store.path_for("k").exists()


def test_a_header_that_claims_a_gigabyte_is_not_read(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.path_for("k").write_bytes(struct.pack("<8sII", MAGIC, FORMAT_VERSION, 2**30) + b"{}")
    with pytest.raises(DamagedState, match="a header of 1,073,741,824 bytes"):
        store.load("k", "m" * 64, "p" * 64)


def test_listing_deletes_and_logs_a_damaged_reading_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path)
    store.save("good", new_header("m" * 64, "p" * 64, 3, b"xyz", "notes.txt", "tiny"), b"xyz")
    write_state(store.path_for("bad"), WRONG_HEADERS["n_tokens-a-string"])
    with caplog.at_level(logging.WARNING, logger="kvchat.engine.kvcache.store"):
        assert [entry.header.document for entry in store.entries()] == ["notes.txt"]
        assert [entry.header.document for entry in store.entries()] == ["notes.txt"]
    assert [record.getMessage() for record in caplog.records] == [
        "deleted a damaged saved reading: bad.kvstate: unreadable header (n_tokens is 'lots')"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["good.kvstate"]


@pytest.mark.system
@pytest.mark.parametrize("kind", ["n_tokens-a-string", "n_tokens-null", "document-a-number"])
def test_cache_list_skips_and_deletes_a_damaged_reading(kind: str, isolated_home: Path) -> None:
    """`kvchat cache list` as a user runs it: no traceback, the damaged reading gone, in the log."""
    states = isolated_home / "cache" / "states"
    StateStore(states).save("good", new_header("m" * 64, "p" * 64, 3, b"xyz", "notes.txt", "tiny"), b"xyz")
    bad = write_state(states / "bad.kvstate", WRONG_HEADERS[kind])
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home), "COLUMNS": "200"}
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "kvchat.cli", "cache", "list"], capture_output=True, text=True,
                                env=env, timeout=120)
        assert result.returncode == 0 and result.stderr == ""
        assert " notes.txt " in result.stdout and "1 saved" in result.stdout
    assert not bad.exists()
    logged = (log_dir() / LOG_FILE_NAME).read_text().splitlines()
    assert sum("deleted a damaged saved reading: bad.kvstate: unreadable header" in line for line in logged) == 1


RECORDER = """
import sys
from pathlib import Path
from kvchat.engine.reading.speeds import ReadingSpeeds
speeds = ReadingSpeeds(Path(sys.argv[1]), "model")
for number in range(25):
    speeds.record(f"{sys.argv[2]}-{number}", 1024, 1.0)
"""


@pytest.mark.system
def test_processes_recording_speeds_at_once_lose_none_of_them(tmp_path: Path) -> None:
    """A background reading and a foreground ask record at once: the lock keeps both records."""
    path = tmp_path / "reading-speeds.json"
    writers = [subprocess.Popen([sys.executable, "-c", RECORDER, str(path), f"writer{index}"]) for index in range(4)]
    assert [writer.wait(timeout=120) for writer in writers] == [0] * 4
    assert len(json.loads(path.read_text())["model"]) == 4 * 25
