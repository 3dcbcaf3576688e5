"""`kvchat read`, and a fast first answer's whole reading finished in the background by `kvchat ask`:
saved once, loaded by the next question, one reader per document, stoppable, and off on request."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from kvchat.cli.background import (
    NICENESS, SESSION_GROUP, job_command, jobs_folder, log_path, start_background_reading, take_job, write_job,
)
from kvchat.documents import load_document
from kvchat.engine import WAITING_FOR_TURN, AskSettings, Engine, KvLayout, readings_in_progress
from kvchat.engine.kvcache.foreground import PAUSED_CHECK_S, Foreground
from kvchat.errors import CancelledError, SettingsError
from kvchat.events import LaterReading, Notice, Progress
from tests.cli.test_cli import ask_args, run_kvchat
from tests.documents.test_formats import make_docx
from tests.documents.test_normalize import make_text_pdf
from tests.tiny_gguf import write_tiny_gguf


def background_readers(home: Path) -> list[int]:
    """The `kvchat read --job` processes whose job lies under `home` (ask detaches them)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:  # ended meanwhile
            continue
        if b"--job" in command and any(str(home).encode() in part for part in command):
            pids.append(int(proc.name))
    return pids


def await_exit(pid: int, timeout_s: float = 240) -> None:
    """Block until process `pid` (not our child) ends: its pidfd becomes readable then."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        assert ready, f"process {pid} still running after {timeout_s} s"
    finally:
        os.close(fd)


def await_background_readers(home: Path) -> None:
    for pid in background_readers(home):
        await_exit(pid)


def background_log() -> list[str]:
    return log_path().read_text().splitlines() if log_path().exists() else []


def asked_twice_around_the_background_reading(document: Path, model: Path, home: Path, said: str, *options: str) -> tuple[dict, dict]:
    """`kvchat ask` with `options`, then, once the background reading it started (which its stderr
    names: `said`) has read the document, again: both answers' records."""
    first = run_kvchat(*ask_args(document, model, *options, "--json"), home=home)
    assert first.returncode == 0, first.stderr
    assert f"{said} in the background" in first.stderr
    await_background_readers(home)
    logged = [line.split(": ", 1)[1] for line in background_log() if "keeps its priority" not in line]  # where /proc is read-only
    assert logged == [f"reading {document}", f"{document}: read"]
    second = run_kvchat(*ask_args(document, model, *options, "--json"), home=home)
    assert second.returncode == 0, second.stderr
    assert "background" not in second.stderr  # nothing left to read
    return json.loads(first.stdout), json.loads(second.stdout)


@pytest.mark.system
def test_the_next_ask_loads_the_reading_a_fast_answer_left_in_the_background(document, tiny_model_path, isolated_home) -> None:
    fast, loaded = asked_twice_around_the_background_reading(document, tiny_model_path, isolated_home,
                                                             "reading the whole document", "--read", "fast")
    assert fast["read"].startswith("fast") and fast["loaded_tokens"] == 0
    assert loaded["read"] == "full" and loaded["read_tokens"] < 50
    assert loaded["loaded_tokens"] == loaded["prompt_tokens"] - loaded["read_tokens"]
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert [(row["state"], row["document"]) for row in listed] == [("saved", str(document))]


@pytest.mark.system
def test_after_a_first_answer_read_auto_the_passages_are_read_in_the_background_and_the_next_ask_loads_them(
    document, tiny_model_path, isolated_home, tmp_path,
) -> None:
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=9)
    fast, loaded = asked_twice_around_the_background_reading(document, tiny_model_path, isolated_home,
                                                             "reading the document's passages", "--draft", str(draft))
    assert fast["read"].startswith("bm25") and fast["loaded_tokens"] == 0
    assert loaded["read"] == f"{fast['read']}, {loaded['loaded_tokens']:,} loaded" and loaded["loaded_tokens"] > 0
    # The same passages, loaded packed (the fresh answer may differ by the blocks' rounding: tests/engine/
    # test_passage_bank.py bounds it); loaded again, the same answer.
    again = run_kvchat(*ask_args(document, tiny_model_path, "--draft", str(draft), "--json"), home=isolated_home)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["answer"] == loaded["answer"] and json.loads(again.stdout)["read"] == loaded["read"]
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert [(row["state"], row["document"]) for row in listed] == [("saved", f"{document} (passages)")]


@pytest.mark.system
def test_a_document_longer_than_the_context_gets_its_passages_read_in_the_background_too(tiny_model_path, isolated_home,
                                                                                         tmp_path) -> None:
    model = write_tiny_gguf(tmp_path / "short.gguf", context_length=1024)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=9, context_length=1024)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(200)))  # 5K tokens of the tiny vocabulary
    fast, loaded = asked_twice_around_the_background_reading(long_document, model, isolated_home,
                                                             "reading the document's passages", "--draft", str(draft))
    assert fast["prompt_tokens"] > 4 * 1024 and fast["method"] == "snapkv" and fast["loaded_tokens"] == 0
    assert loaded["read"] == f"{fast['read']}, {loaded['loaded_tokens']:,} loaded" and loaded["loaded_tokens"] > 0
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert [(row["state"], row["document"]) for row in listed] == [("saved", f"{long_document} (passages)")]


@pytest.mark.system
def test_with_retrieval_each_ask_reads_its_own_passages_and_nothing_in_the_background(document, tiny_model_path, isolated_home) -> None:
    runs = [run_kvchat(*ask_args(document, tiny_model_path, "--read", "retrieval", "--json"), home=isolated_home) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    answers = [json.loads(run.stdout) for run in runs]
    assert [answer["read"].split(",")[0] for answer in answers] == ["bm25", "bm25"]
    assert [answer["loaded_tokens"] for answer in answers] == [0, 0]
    assert not any("background" in run.stderr for run in runs) and background_readers(isolated_home) == []
    assert json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout) == []


@pytest.mark.system
def test_two_background_readings_of_one_document_read_it_once(document, tiny_model_path, isolated_home) -> None:
    settings = AskSettings(threads=1, layout=KvLayout())
    for _ in range(2):  # as two terminals asking about the same new document would
        start_background_reading(load_document(document), str(tiny_model_path), settings, 0, LaterReading.WHOLE)
    await_background_readers(isolated_home)
    ends = [line.split(": ", 1)[1] for line in background_log() if line.endswith((": read", ": already saved"))]
    assert sorted(ends) == [f"{document}: already saved", f"{document}: read"]
    assert sum(line.endswith(f"reading {document}") for line in background_log()) == 1
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert len(listed) == 1 and listed[0]["state"] == "saved"


@pytest.mark.system
def test_cache_stop_ends_a_background_reading_and_saves_nothing(tmp_path, isolated_home) -> None:
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(1000)))  # 29k tokens of the tiny vocabulary
    job = write_job(load_document(long_document), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE)
    with subprocess.Popen(job_command(job), stderr=subprocess.PIPE, text=True) as reader:
        assert reader.stderr.readline().endswith(f"reading {long_document}\n")  # it holds the reading's lock now
        stopped = run_kvchat("cache", "stop", home=isolated_home)
        assert stopped.returncode == 0 and stopped.stdout.startswith(f"stopped the reading of {long_document} (")
        assert reader.wait(timeout=120) == 130 and reader.stderr.read() == "kvchat: stopped\n"
    in_progress = readings_in_progress()
    assert list((isolated_home / "cache" / "states").glob("*")) == []  # no reading, no half-written file
    assert in_progress.entries() == [] and list(in_progress.root.glob("*.json")) == []
    assert run_kvchat("cache", "stop", home=isolated_home).stdout == "no reading in progress\n"


@pytest.mark.system
def test_background_readings_of_two_documents_take_turns_and_a_waiting_one_stops_too(tmp_path, document, isolated_home) -> None:
    """Each background reading holds a context as large as its document: the second waits for the
    first to end (`cache list` says so) rather than reading at once beside it."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(1000)))  # 29k tokens
    jobs = [write_job(load_document(path), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE) for path in (long_document, document)]
    with subprocess.Popen(job_command(jobs[0]), stderr=subprocess.PIPE, text=True) as first:
        assert first.stderr.readline().endswith(f"reading {long_document}\n")  # it holds the turn now
        with subprocess.Popen(job_command(jobs[1]), stderr=subprocess.PIPE, text=True) as second:
            assert second.stderr.readline().endswith(f": {WAITING_FOR_TURN}\n")
            listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
            assert sorted((row["document"], row["state"]) for row in listed) == [
                (str(long_document), "reading"), (str(document), "queued")]
            shown = run_kvchat("cache", "list", home=isolated_home, env={"COLUMNS": "240"}).stdout
            assert "after the reading before it" in shown
            stopped = run_kvchat("cache", "stop", home=isolated_home).stdout.splitlines()
            assert sorted(line.split(" (")[0] for line in stopped) == sorted(
                f"stopped the reading of {path}" for path in (document, long_document))
            assert second.wait(timeout=120) == 130 and first.wait(timeout=120) == 130
    assert list((isolated_home / "cache" / "states").glob("*")) == [] and readings_in_progress().entries() == []


def _cpu_s(pid: int) -> float:
    """The CPU time process `pid` has used so far (user + system, /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.system
def test_a_background_reading_pauses_while_a_question_is_answered_and_then_goes_on(tmp_path, isolated_home) -> None:
    """`kvchat ask` holds the foreground while it reads and answers: a background reading started
    meanwhile pauses after its first batch, takes no CPU while paused, and reads on when the question is answered."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=16384)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(300)))  # 8.4k tokens: 17 batches
    job = write_job(load_document(long_document), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE)
    question = Foreground(readings_in_progress().root).answering()
    question.__enter__()
    with subprocess.Popen(job_command(job), stderr=subprocess.PIPE, text=True) as reader:
        try:
            assert reader.stderr.readline().endswith(f"reading {long_document}\n")
            assert reader.stderr.readline().endswith(f"paused reading {long_document} while a question is answered\n")
            before = _cpu_s(reader.pid)
            threading.Event().wait(4 * PAUSED_CHECK_S)  # nothing to await: a paused reading does nothing
            assert _cpu_s(reader.pid) - before < 0.5 * PAUSED_CHECK_S  # reading on would take the second whole
        finally:
            question.__exit__(None, None, None)
        assert reader.stderr.readline().endswith(f"went on reading {long_document} after the question was answered\n")
        assert reader.stderr.readline().endswith(f"{long_document}: read\n")
        assert reader.wait(timeout=120) == 0
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert [(row["state"], row["document"]) for row in listed] == [("saved", str(long_document))]


@pytest.mark.system
def test_kvchat_ask_holds_the_foreground_from_its_start_before_its_models_load(tmp_path, isolated_home) -> None:
    """`kvchat ask` takes the foreground before it loads its document (here from standard input,
    held open) and its models: a background reading begun meanwhile pauses after its first batch.
    That another process took a lock is no event to await: the test looks every 50 ms."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=16384)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(300)))
    job = write_job(load_document(long_document), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE)
    ask = [sys.executable, "-m", "kvchat.cli", *ask_args(Path("-"), model, "--no-cache")]
    env, foreground = {**os.environ, "KVCHAT_HOME": str(isolated_home)}, Foreground(readings_in_progress().root)
    with subprocess.Popen(ask, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as asking:
        looks = 0
        while not foreground.busy() and asking.poll() is None and looks < 1200:
            threading.Event().wait(0.05)
            looks += 1
        assert foreground.busy(), "kvchat ask did not hold the foreground while it waited for its document"
        with subprocess.Popen(job_command(job), stderr=subprocess.PIPE, text=True) as reader:
            assert reader.stderr.readline().endswith(f"reading {long_document}\n")
            assert reader.stderr.readline().endswith(f"paused reading {long_document} while a question is answered\n")
            _, err = asking.communicate("Item 7 costs 21 dollars.", timeout=120)  # the document, at last
            assert asking.returncode == 0, err
            assert reader.stderr.readline().endswith(f"went on reading {long_document} after the question was answered\n")
            assert reader.stderr.readline().endswith(f"{long_document}: read\n")
            assert reader.wait(timeout=120) == 0


def _stderr_line_with(process: subprocess.Popen, text: str, timeout_s: float = 120) -> str:
    """The first line of `process`'s stderr that holds `text` (the process is killed after
    `timeout_s`, which ends the wait)."""
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    try:
        for line in process.stderr:
            if text in line:
                return line
        raise AssertionError(f"kvchat never said {text!r}")
    finally:
        timer.cancel()


@pytest.mark.system
def test_an_ask_that_awaits_a_background_reading_of_its_document_lets_it_go_on(tmp_path, isolated_home) -> None:
    """`kvchat ask` holds the foreground from its start, and steps aside while it awaits another
    process's whole reading of its own document: that reading would otherwise pause for the ask
    that waits for it, and neither would end."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=16384)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(300)))
    job = write_job(load_document(long_document), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE)
    elsewhere = Foreground(readings_in_progress().root).answering()  # holds the reader after its first batch
    elsewhere.__enter__()
    with subprocess.Popen(job_command(job), stderr=subprocess.PIPE, text=True) as reader:
        try:
            assert reader.stderr.readline().endswith(f"reading {long_document}\n")
            assert reader.stderr.readline().endswith(f"paused reading {long_document} while a question is answered\n")
            asking = subprocess.Popen([sys.executable, "-m", "kvchat.cli", *ask_args(long_document, model, "--read", "full")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _stderr_line_with(asking, "waiting for the whole reading of this document in another kvchat process")
        finally:
            elsewhere.__exit__(None, None, None)  # from now on only the ask could hold the reader
        try:
            _, err = asking.communicate(timeout=120)
        finally:
            asking.kill()  # one that waits for ever lets the reader go on as it ends
        assert asking.returncode == 0, err
        assert reader.wait(timeout=120) == 0


def _group_niceness(pid: int | str) -> int:
    """The niceness of the scheduling group of process `pid`'s session (/proc/PID/autogroup:
    "/autogroup-42 nice 19")."""
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


@pytest.mark.system
@pytest.mark.skipif(not SESSION_GROUP.exists() or not SESSION_GROUP.read_text().strip(),
                    reason="this kernel does not group processes by session (no /proc/self/autogroup)")
@pytest.mark.parametrize("own_session", [True, False], ids=["detached", "in-our-session"])
def test_a_background_reading_gives_way_in_its_sessions_scheduling_group_too(tmp_path, isolated_home, own_session) -> None:
    """Detached as `kvchat ask` starts it, the reader lowers its session's group to niceness 19:
    Linux shares the CPU between sessions before it looks at niceness. One in our session leaves
    our group as it was."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(1000)))  # 29k tokens
    job = write_job(load_document(long_document), str(model), AskSettings(threads=1), 0, LaterReading.WHOLE)
    ours = _group_niceness("self")
    with subprocess.Popen(job_command(job), stderr=subprocess.PIPE, text=True, start_new_session=own_session) as reader:
        try:
            first = reader.stderr.readline()
            if "keeps its priority" in first:
                pytest.skip(f"this machine does not let a process renice its session's group: {first.strip()}")
            assert first.endswith(f"reading {long_document}\n")  # it lowered its priority before
            assert os.getpriority(os.PRIO_PROCESS, reader.pid) == NICENESS
            assert _group_niceness(reader.pid) == (NICENESS if own_session else ours)
            assert _group_niceness("self") == ours
        finally:
            reader.terminate()
            if _group_niceness("self") != ours:  # a reader that lowered our group (the test failed): the terminal's back
                SESSION_GROUP.write_text(str(ours))
        assert reader.wait(timeout=120) == 130


def _fast_answer(engine: Engine, path: Path):
    """A conversation about `path` whose first answer came from a fast reading (the document unread)."""
    chat = engine.conversation(load_document(path), AskSettings(read="fast", max_tokens=2, threads=2))
    list(chat.open("What does item 7 cost?"))
    list(engine.answer(chat, "What does item 7 cost?"))
    assert chat.unread
    return chat


def test_the_chat_reading_on_after_a_fast_answer_waits_for_another_process_and_loads_its_reading(
    document, tiny_model_path, isolated_home,
) -> None:
    """A chat's reading after a fast answer (Conversation.read_on, and a follow-up that reads on)
    takes the reading's lock as `kvchat read` does: while another process holds it, the chat
    follows that reading and then loads it."""
    with Engine(str(tiny_model_path)) as engine:
        chat = _fast_answer(engine, document)
        other = readings_in_progress().claim(chat.reading_key, str(document), "another process", len(chat.document_tokens))
        following, events = threading.Event(), []

        def read_on() -> None:
            for event in chat.read_on():
                events.append(event)
                following.set()

        reader = threading.Thread(target=read_on)
        reader.start()
        assert following.wait(timeout=60) and events[0] == Notice(f"another kvchat process is reading {document}; waiting for it")
        saving = engine.conversation(load_document(document), AskSettings(threads=2))
        list(saving.open())  # what the other process does: read it whole and save it
        saving.close()
        other.release()
        reader.join(timeout=60)
        assert not reader.is_alive() and not chat.unread
        assert chat.run.loaded_upto == len(chat.document_tokens)  # loaded, not read again
        chat.close()


def test_a_reading_queued_behind_others_is_not_waited_for(document, tiny_model_path, isolated_home) -> None:
    """A queued background reading holds its document's lock but has no head start: the chat reads
    the document itself, and `kvchat ask` does not wait for it either."""
    from kvchat.engine.answering.route import _sooner_to_wait

    with Engine(str(tiny_model_path)) as engine:
        chat = _fast_answer(engine, document)
        queued = readings_in_progress().claim(chat.reading_key, str(document), "a queued job", len(chat.document_tokens))
        queued.queued(True)
        events = list(chat.read_on())
        assert not any(isinstance(event, Notice) for event in events) and not chat.unread
        assert chat.run.loaded_upto == 0 and chat.saved  # read here, and saved: the queued job will find it
        (record,) = readings_in_progress().entries()
        assert record.queued and _sooner_to_wait(chat, record) is False
        queued.release()
        chat.close()


@pytest.mark.parametrize(("read", "waits"), [("fast", True), ("retrieval", False)])
def test_another_process_reading_all_but_done_is_awaited_unless_every_question_reads_fast(
    document, tiny_model_path, tmp_path, isolated_home, read: str, waits: bool,
) -> None:
    """A fast reading of this prompt takes seconds here, the other process's rest a tenth of one:
    awaiting it answers sooner, unless its reading would never be loaded (retrieval)."""
    from kvchat.engine.answering.route import _sooner_to_wait
    from kvchat.engine.kvcache.progress_record import InProgress
    from kvchat.engine.reading.speeds import ReadingSpeeds
    from kvchat.policy import SnapKV

    settings = AskSettings(method=SnapKV(budget=64, window=16), read=read, max_tokens=2, threads=2)
    with Engine(str(tiny_model_path)) as engine:
        chat = engine.conversation(load_document(document), settings)
        chat.speeds = ReadingSpeeds(tmp_path / "speeds.json", "tiny")
        for kind in ("fast", "fast bm25", chat.reading.speed):
            chat.speeds.record(kind, 1000, 10.0)  # 100 tokens/s
        all_but_done = InProgress(chat.reading_key, str(document), "tiny", 1, done=999, total=1000, started=0.0, updated=99.9,
                                  read_s=99.9)
        # a saved part of 999 tokens loaded, no batch read yet: told at this machine's whole-reading speed
        loaded = replace(all_but_done, read_from=999, read_s=0.0)
        try:
            assert chat.reads_fast_first() and all_but_done.left_s == pytest.approx(0.1) and loaded.left_s is None
            assert _sooner_to_wait(chat, all_but_done) is waits and _sooner_to_wait(chat, loaded) is waits
        finally:
            chat.close()


@pytest.mark.system
def test_cache_stop_leaves_a_chats_own_reading_to_the_chat(tmp_path, isolated_home) -> None:
    """The chat's reading is listed, but `cache stop` does not send its process SIGTERM (which
    would end the chat, its terminal left in raw mode): the chat stops it itself."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    long_document = tmp_path / "ledger.txt"
    long_document.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(1000)))
    with Engine(str(model)) as engine:
        chat = _fast_answer(engine, long_document)
        cancel, reading = threading.Event(), threading.Event()

        def read_on() -> None:
            with contextlib.suppress(CancelledError):  # the test stops it
                for event in chat.read_on(cancel):
                    if isinstance(event, Progress):
                        reading.set()

        reader = threading.Thread(target=read_on)
        reader.start()
        try:
            assert reading.wait(timeout=60)
            (listed,) = readings_in_progress().entries()
            assert listed.pid == os.getpid() and not listed.stoppable
            stopped = run_kvchat("cache", "stop", home=isolated_home)
            assert stopped.stdout == f"left the reading of {long_document} to the question, chat or server reading it (process {os.getpid()})\n"
        finally:
            cancel.set()
            reader.join(timeout=60)
        chat.close()


@pytest.mark.system
def test_background_reading_off_reads_nothing_after_the_answer(document, tiny_model_path, isolated_home) -> None:
    env_off = {"KVCHAT_BACKGROUND_READING": "off"}
    first = run_kvchat(*ask_args(document, tiny_model_path, "--read", "fast"), home=isolated_home, env=env_off)
    assert first.returncode == 0, first.stderr and "background" not in first.stderr
    assert background_readers(isolated_home) == [] and not (isolated_home / "cache" / "reading" / "jobs").exists()
    assert json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout) == []
    wrong = run_kvchat(*ask_args(document, tiny_model_path), home=isolated_home, env={"KVCHAT_BACKGROUND_READING": "later"})
    assert wrong.returncode == 2 and wrong.stderr.strip() == (
        "kvchat: error: unknown KVCHAT_BACKGROUND_READING 'later' (hint: set KVCHAT_BACKGROUND_READING to on or off)")


@pytest.mark.system
def test_read_saves_a_folders_documents_and_skips_what_it_cannot_read(tmp_path, tiny_model_path, isolated_home) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    make_text_pdf(folder / "lease.pdf", [[f"Clause {i}: the rent is {i * 100} euros." for i in range(30)]])
    make_docx(folder / "report.docx")
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    args = ["read", str(folder), "--model", str(tiny_model_path), "--threads", "2"]
    first = run_kvchat(*args, home=isolated_home)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert f"skipped {folder / 'photo.png'}: not a PDF, DOCX, EPUB, TXT, Markdown or HTML file" in lines
    assert [line.split(": ")[1].split(" (")[0] for line in lines if line.startswith(str(folder / "lease"))] == ["read"]
    assert [line.split(": ")[1].split(" (")[0] for line in lines if line.startswith(str(folder / "report"))] == ["read"]
    assert lines[-1] == "2 read"
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert sorted(row["document"] for row in listed) == [str(folder / "lease.pdf"), str(folder / "report.docx")]
    again = run_kvchat(*args, home=isolated_home)
    assert again.returncode == 0 and again.stderr.splitlines()[-1] == "2 already saved"
    asked = run_kvchat("ask", str(folder / "lease.pdf"), "What is the rent of clause 3?", "--model", str(tiny_model_path),
                       "--max-tokens", "4", "--json", home=isolated_home)
    record = json.loads(asked.stdout)
    assert record["read_tokens"] < 50 and record["loaded_tokens"] > 300


def test_a_job_file_kvchat_wrote_is_taken_whole_and_removed(document) -> None:
    settings = AskSettings(threads=1, layout=KvLayout(flash_attn=True, type_v="q8_0"), system="Answer briefly.")
    job = write_job(load_document(document), "tiny.gguf", settings, 3, LaterReading.PASSAGES)
    taken, model, gpu_layers, read_settings, later = take_job(job)
    assert (taken, model, gpu_layers, later) == (load_document(document), "tiny.gguf", 3, LaterReading.PASSAGES)
    assert (read_settings.threads, read_settings.layout, read_settings.system, read_settings.read) == (
        1, settings.layout, "Answer briefly.", "full")
    assert not job.exists()


def _in_jobs_folder(kind: str, victim: Path) -> Path:
    """Something in kvchat's jobs folder, named as a job is, that is not a job kvchat wrote."""
    job = jobs_folder() / f"{'0' * 32}.json"
    job.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link to the user's file":
        job.symlink_to(victim)
    elif kind == "folder":
        job.mkdir()
    else:
        job.write_text({"not JSON": "notes\n", "another shape": '{"document": "notes.txt"}',
                        "a wrong type": json.dumps({**json.loads(write_job(load_document(victim), "m", AskSettings(), 0, LaterReading.WHOLE).read_text()),
                                                    "gpu_layers": "all"})}[kind])
    return job


@pytest.mark.parametrize("kind", ["the user's file", "the user's folder"])
def test_a_job_outside_kvchats_jobs_folder_is_refused_and_left_alone(kind, tmp_path) -> None:
    """`kvchat read --job precious.txt` once deleted precious.txt."""
    named = tmp_path / "precious.txt"
    named.mkdir() if kind == "the user's folder" else named.write_text("notes\n")
    with pytest.raises(SettingsError) as refused:
        take_job(named)
    assert refused.value.message == f"{named} is not a kvchat job file (not in kvchat's jobs folder); it is left as it is"
    assert named.is_dir() if kind == "the user's folder" else named.read_text() == "notes\n"


@pytest.mark.parametrize("kind", ["link to the user's file", "folder", "not JSON", "another shape", "a wrong type"])
def test_what_is_not_a_job_kvchat_wrote_is_refused_even_in_its_jobs_folder_and_left_there(kind, tmp_path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("notes\n")
    job = _in_jobs_folder(kind, victim)
    with pytest.raises(SettingsError, match=r" is not a kvchat job file \(.+\); it is left as it is$"):
        take_job(job)
    assert job.is_symlink() or job.exists()
    assert victim.read_text() == "notes\n"


@pytest.mark.system
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_read_job_refuses_a_users_file_in_one_line_and_leaves_it(kind, tmp_path, isolated_home) -> None:
    named = tmp_path / ("precious.txt" if kind == "file" else "some_dir")
    named.mkdir() if kind == "folder" else named.write_text("notes\n")
    result = run_kvchat("read", "--job", str(named), home=isolated_home)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"kvchat: error: {named} is not a kvchat job file (not in kvchat's jobs folder)")
    assert named.is_dir() if kind == "folder" else named.read_text() == "notes\n"


@pytest.mark.system
def test_two_asks_at_once_about_one_new_document_read_it_once(tmp_path, isolated_home) -> None:
    """The second awaits the first's whole reading and loads it, as it awaits a background reading."""
    model = write_tiny_gguf(tmp_path / "long-context.gguf", context_length=32768)
    ledger = tmp_path / "ledger.txt"
    ledger.write_text(" ".join(f"Item {i} costs {i * 3} dollars." for i in range(400)))  # 11k tokens of the tiny vocabulary
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    command = [sys.executable, "-m", "kvchat.cli", *ask_args(ledger, model, "--read", "full", "--json")]
    asks = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ended = [ask.communicate(timeout=300) for ask in asks]
    assert [ask.returncode for ask in asks] == [0, 0], ended
    loaded = sorted(json.loads(out)["loaded_tokens"] > 0 for out, _ in ended)
    assert loaded == [False, True], ended  # one read it whole; the other loaded that reading
    listed = json.loads(run_kvchat("cache", "list", "--json", home=isolated_home).stdout)
    assert [row["state"] for row in listed] == ["saved"]
