"""`kvchat serve` over real sockets with the official `openai` client.

On the tiny random GGUF: the protocol, the bookkeeping, saved readings and the concurrency (the
tiny model's text is noise; what the answers say is checked on the real model, in
test_server_real.py). On the fake engine: the scheduling as a client sees it, step by step.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import json
import logging
import re
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pypdf
import pytest

from tests.conftest import REPO_DIR
from tests.fake_engine import WAIT_S, FakeEngine, Script
from kvchat.cli.serve import PYTHON_EXAMPLE
from kvchat.engine import AskSettings, KvLayout, UserSettings, ask_settings
from kvchat.engine.answering import elsewhere
from kvchat.errors import DecodeError, SettingsError
from kvchat.events import Event, LaterReading, Notice, Progress
from kvchat.server.service import NewScheduler
from kvchat.engine import PreparedPrompt
from kvchat.serving.prepared import prepare
from kvchat.serving.requests import ChatRequest
from kvchat.serving.scheduler import Scheduler
from tests.server_harness import running_server, serving, watch_jobs
from tests.server.test_server_shutdown import KEY, serve_process

MODEL = "kvchat-test"
NOTES = b"The boat was named the Grey Heron. The radio failed on day four. The budget was 4,350 euros.\n" * 20


@pytest.fixture(scope="module")
def server(tiny_model_path: Path):
    with running_server(tiny_model_path, budget=64, max_tokens=16, sequences=4, max_waiting=16) as running:
        yield running


@pytest.fixture
def client(server) -> openai.OpenAI:
    url, _ = server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client: openai.OpenAI, content: str = "Hello there", **extra) -> object:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8, **extra
    )


def test_models_and_health(client: openai.OpenAI, server) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "kvchat"
    health = httpx.get(f"{server[0]}/health").json()
    assert health["status"] == "ok" and health["sequences"] == 4


def test_a_completion_has_content_and_usage(client: openai.OpenAI) -> None:
    completion = ask(client)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streaming_sends_the_same_answer_in_chunks(client: openai.OpenAI) -> None:
    whole = ask(client, "Stream this")
    chunks = list(ask(client, "Stream this", stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_question_about_the_whole_document_is_answered_from_its_parts(client: openai.OpenAI, server) -> None:
    url, _ = server
    uploaded = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES, "text/plain")}).json()
    summary = ask(client, "Summarize this document.", extra_body={"document_id": uploaded["id"]})
    off = ask(client, "Summarize this document.", extra_body={"document_id": uploaded["id"], "kv_in_parts": "off"})
    kv, kv_off = summary.model_extra["kv"], off.model_extra["kv"]
    assert kv["read"] == "in 1 part" and kv["notices"][0].startswith("a question about the whole document")
    assert summary.usage.prompt_tokens > uploaded["tokens"]  # the part, with its prompt around it
    text = " ".join(NOTES.decode().split())
    assert all(source["text"] in text for source in kv["sources"]) and len(kv["sources"]) <= 1  # the part's first
    assert kv_off["read"] == "full" and kv_off["kept_tokens"] <= 64 + 1 and not kv_off["notices"]


def test_upload_list_chat_and_delete_a_document(client: openai.OpenAI, server) -> None:
    url, _ = server
    uploaded = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES, "text/plain")}).json()
    assert uploaded["id"].startswith("doc-") and uploaded["pages"] == 1 and uploaded["tokens"] > 200
    listed = httpx.get(f"{url}/v1/documents").json()["data"]
    assert uploaded["id"] in [document["id"] for document in listed]
    completion = ask(client, "What was the boat called?", extra_body={"document_id": uploaded["id"], "kv_budget": 48})
    assert completion.usage.prompt_tokens > uploaded["tokens"]  # the document is in the prompt
    assert completion.model_extra["kv"]["kept_tokens"] <= 48 + 1
    assert httpx.delete(f"{url}/v1/documents/{uploaded['id']}").json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        ask(client, "And now?", extra_body={"document_id": uploaded["id"]})
    assert httpx.delete(f"{url}/v1/documents/{uploaded['id']}").status_code == 404


def test_bad_uploads_get_a_one_line_reason(server) -> None:
    url, _ = server
    empty = httpx.post(f"{url}/v1/documents", files={"file": ("empty.txt", b"", "text/plain")})
    binary = httpx.post(f"{url}/v1/documents", files={"file": ("x.bin", bytes(range(256)) * 40, "application/octet-stream")})
    for response in (empty, binary):
        assert response.status_code == 400
        assert "\n" not in response.json()["error"]["message"]


def test_eight_clients_five_requests_each_get_their_own_answers(client: openai.OpenAI) -> None:
    """Greedy answers are deterministic: each answer given while 8 clients share the sequences
    (batched, in whatever order) is the one its question gets when asked alone."""
    sessions = [[f"client {index} request {turn}" for turn in range(5)] for index in range(8)]
    alone = {question: ask(client, question).choices[0].message.content for session in sessions for question in session}
    assert len(set(alone.values())) > 10  # most questions get answers of their own: most swaps would show

    def client_session(questions: list[str]) -> list[tuple[str, object]]:
        return [(question, ask(client, question).choices[0]) for question in questions]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answered = [pair for session in pool.map(client_session, sessions) for pair in session]
    assert len(answered) == 40 and all(choice.finish_reason in ("stop", "length") for _, choice in answered)
    assert {question: choice.message.content for question, choice in answered} == alone


@dataclass
class Reading:
    """One request's preparation (reading or loading, then selecting), seen from outside."""

    request: ChatRequest
    events: list[Event] = field(default_factory=list)
    prepared: PreparedPrompt | None = None

    @property
    def progress(self) -> list[int]:
        """Prompt tokens done, as the reading went on: a reading that loaded N tokens never
        reports fewer than N (the start of a read is reported, the end of each batch)."""
        return [event.done for event in self.events if isinstance(event, Progress)]

    @property
    def notices(self) -> list[str]:
        return [event.text for event in self.events if isinstance(event, Notice)]


def recording(readings: list[Reading]) -> NewScheduler:
    """A scheduler whose preparations are appended to `readings`, in order, with their events and result."""

    def recorded_prepare(engine, request, cancel, sampler):
        reading = Reading(request)
        readings.append(reading)
        events = prepare(engine, request, cancel, sampler)
        while True:
            try:
                event = next(events)
            except StopIteration as finished:
                reading.prepared = finished.value
                return finished.value
            reading.events.append(event)
            yield event

    return functools.partial(Scheduler, prepare=recorded_prepare)


def test_a_follow_up_loads_its_conversations_reading_and_reads_only_what_is_new(tiny_model_path: Path) -> None:
    """A pasted chat's follow-up (the client sends the history back) loads the reading saved of
    the first request (all before its observation window) and reads on from there."""
    pasted = NOTES.decode()
    readings: list[Reading] = []
    with running_server(tiny_model_path, use_cache=True, new_scheduler=recording(readings), budget=64, max_tokens=8,
                        sequences=1) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        first = ask(client, pasted)
        history = [{"role": "user", "content": pasted}, {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "And the budget?"}]
        follow_up = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8)
        unrelated = ask(client, "Another chat. " + pasted)
    opened, continued, other = readings
    window = opened.request.settings.method.window
    saved = first.usage.prompt_tokens - window
    assert opened.prepared.selected.loaded_tokens == 0 and opened.progress[0] == 0 and opened.progress[-1] == saved
    assert continued.prepared.selected.loaded_tokens == saved and continued.progress[0] == saved
    assert continued.progress[-1] == follow_up.usage.prompt_tokens - window
    assert other.prepared.selected.loaded_tokens == 0 and other.progress[0] == 0
    assert other.progress[-1] == unrelated.usage.prompt_tokens - window
    kv = {name: completion.model_extra["kv"] for name, completion in
          (("first", first), ("follow_up", follow_up), ("unrelated", unrelated))}  # what a client sees
    assert (kv["first"]["loaded_tokens"], kv["first"]["read_tokens"]) == (0, first.usage.prompt_tokens)
    assert (kv["follow_up"]["loaded_tokens"], kv["follow_up"]["read_tokens"]) == (saved, follow_up.usage.prompt_tokens - saved)
    assert (kv["unrelated"]["loaded_tokens"], kv["unrelated"]["read_tokens"]) == (0, unrelated.usage.prompt_tokens)


def test_a_server_with_flash_attention_on_answers_about_documents(tiny_model_path: Path) -> None:
    """Readings are made, saved and moved into the shared context with flash attention on (V not
    transposed): a shared context laid out otherwise refuses those states. The upload is read
    whole (before the first question, or by it: the tiny model has no fast reading); every
    question loads that reading and reads only its turns and question."""
    layout = KvLayout(flash_attn=True)
    readings: list[Reading] = []
    with running_server(tiny_model_path, use_cache=True, new_scheduler=recording(readings), budget=64, max_tokens=8,
                        sequences=2, layout=layout) as (url, service):
        assert service.scheduler.decoder.ctx.settings.flash_attn
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        document = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()["id"]
        history: list[dict[str, str]] = []
        prompts = []
        for question in ("What was the boat called?", "And the budget?", "And the radio?"):
            history.append({"role": "user", "content": question})
            answer = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, extra_body={"document_id": document})
            assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens > 0
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
            prompts.append(answer.usage.prompt_tokens)
    assert len(readings) == 3
    window = readings[0].request.settings.method.window
    (notice,) = readings[0].notices
    document_tokens = int(notice.rsplit("(", 1)[1].split(" ")[0].replace(",", ""))
    for reading, prompt_tokens in zip(readings, prompts):
        assert reading.notices == [f"loaded the saved reading of notes.txt ({document_tokens:,} tokens)"]
        assert min(reading.progress) > document_tokens  # nothing of the document was read again
        assert reading.progress[-1] == prompt_tokens - window  # read up to the question's observation window


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b'{"model": "kvchat-test"}', 400),
        (b'{"model": "kvchat-test", "messages": []}', 400),
        (b'{"model": "kvchat-test", "messages": [{"role": "wizard", "content": "hi"}]}', 400),
        (b'{"model": "other", "messages": [{"role": "user", "content": "hi"}]}', 404),
        (b'{"model": "kvchat-test", "messages": [{"role": "user", "content": "hi"}], "kv_budget": 100000}', 400),
        (b'{"model": "kvchat-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}', 400),
        (b'{"model": "kvchat-test", "messages": [{"role": "user", "content": "hi"}], "document_id": "doc-none"}', 404),
    ],
)
def test_malformed_requests_get_openai_shaped_4xx(server, body: bytes, status: int) -> None:
    url, _ = server
    response = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"] and "Traceback" not in response.text


def test_a_body_over_the_limit_gets_413(tiny_model_path: Path) -> None:
    with running_server(tiny_model_path, budget=64, max_tokens=8, sequences=1, max_body_bytes=1000) as (url, _):
        big = b'{"model": "kvchat-test", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
        response = httpx.post(f"{url}/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_an_api_key_is_required_when_set(tiny_model_path: Path) -> None:
    with running_server(tiny_model_path, api_key="sesame", budget=64, max_tokens=8, sequences=1) as (url, _):
        wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        assert httpx.get(f"{url}/v1/models").status_code == 401
        right = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        assert ask(right).choices[0].message.role == "assistant"
        assert httpx.get(f"{url}/health").status_code == 200


# ---- scheduling over HTTP, on the fake engine (tests/fake_engine.py) ---------------------------------


def _raw_chat(url: str, content: str, stream: bool) -> socket.socket:
    """A chat request sent on a socket of its own, whose answer nobody reads."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}).encode()
    host, port = url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)))
    connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return connection


def _chat(url: str, content: str, **extra: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def _streamed(url: str, content: str) -> list[dict | str]:
    """A streamed answer's events: the parsed chunks, then "[DONE]"."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as response:
        data = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


def _health(url: str) -> tuple[int, int, int]:
    health = httpx.get(f"{url}/health").json()
    return health["answering"], health["reading"], health["waiting"]


def test_an_answer_reports_its_prompt_tokens_loaded_read_and_kept() -> None:
    fake = FakeEngine({"Boat?": Script("Grey Héron", prompt_tokens=2000, loaded_tokens=1500, kept_tokens=256)})
    with serving(fake.service()) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Boat?"}])
        cut = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Boat?"}], max_tokens=4)
        chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Boat?"}],
                                                     stream=True, stream_options={"include_usage": True}))
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == ("Grey Héron", "stop")
    usage, kv = whole.usage, whole.model_extra["kv"]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2000, 11, 2011)  # "é" is two tokens
    assert (kv["prompt_tokens"], kv["loaded_tokens"], kv["read_tokens"], kv["kept_tokens"]) == (2000, 1500, 500, 256)
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("Grey", "length", 4)
    deltas = [(chunk.choices[0].delta.content, chunk.choices[0].finish_reason) for chunk in chunks if chunk.choices]
    assert deltas == [("", None), *((piece, None) for piece in "Grey Héron"), (None, "stop")]
    assert chunks[-1].usage.completion_tokens == 11


def test_a_bug_while_reading_is_a_500_and_a_bad_request_a_400() -> None:
    fake = FakeEngine({"bug": Script(error=RuntimeError("a bug")),
                       "bad": Script(error=SettingsError("the request has no messages", "send at least one user message"))})
    with serving(fake.service()) as url:
        replies = {question: httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": question}]}) for question in ("bug", "bad")}
    assert replies["bug"].status_code == 500 and replies["bug"].json()["error"] == {
        "message": "internal error: a bug (hint: see the server's log file)", "type": "server_error",
        "code": "internal_error", "param": None}
    assert replies["bad"].status_code == 400
    assert replies["bad"].json()["error"]["message"] == "the request has no messages (hint: send at least one user message)"


def test_a_full_waiting_line_gets_429_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine({"first": Script(until_cancelled=True)})
    service = fake.service(sequences=1, max_waiting=1)
    jobs = watch_jobs(service.scheduler, monkeypatch)
    with serving(service) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = _raw_chat(url, "first", stream=False)
        (reading,) = fake.readings.wait_len(1)
        waiting = pool.submit(_chat, url, "second")
        jobs.wait_len(2)
        assert _health(url) == (0, 1, 1)
        refused = _chat(url, "third")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        first.close()  # its client leaves: the reading stops, the waiting request gets the sequence
        answered = waiting.result(timeout=WAIT_S)
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "ok"
    assert reading.outcome == "cancelled"
    assert [reading.request.messages[-1]["content"] for reading in fake.readings.items] == ["first", "second"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_reading_is_counted_and_a_client_that_leaves_during_it_stops_it(stream: bool) -> None:
    fake = FakeEngine({"held": Script(until_cancelled=True)})
    with serving(fake.service(sequences=1)) as url:
        connection = _raw_chat(url, "held", stream)
        (reading,) = fake.readings.wait_len(1)
        assert _health(url) == (0, 1, 0)
        connection.close()
        assert reading.ended.wait(WAIT_S) and reading.outcome == "cancelled", "the reading went on after its client left"
        answer = _chat(url, "next")
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "ok"
        assert _health(url) == (0, 0, 0)


def test_a_client_that_leaves_during_its_answer_frees_the_sequence_after_the_current_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine({"long": Script("abcdefgh")}, held_steps=True)
    service = fake.service(sequences=1)
    jobs = watch_jobs(service.scheduler, monkeypatch)
    with serving(service) as url:
        connection = _raw_chat(url, "long", stream=True)
        (watched,) = jobs.wait_len(1)
        watched.emitted.wait_len(1)  # its first token; its first step waits
        assert _health(url) == (1, 0, 0)
        connection.close()
        assert watched.job.cancel.wait(WAIT_S), "the answer went on after its client left"
        fake.decoder.run_free()
        done = watched.emitted.ended()[-1]
        assert (done.answer, done.stats.generated_tokens, done.stats.stop_reason) == ("ab", 2, "cancelled")
        assert _health(url) == (0, 0, 0) and fake.decoder.releases.items == [0]


def test_the_shutdown_ends_answers_and_gives_readings_and_waiting_requests_503(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine({"answered": Script("abc", paced=True), "read": Script(until_cancelled=True)})
    service = fake.service(sequences=2)
    jobs = watch_jobs(service.scheduler, monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        with serving(service) as url:
            answered = pool.submit(_streamed, url, "answered")
            (reading,) = fake.readings.wait_len(1)
            read = pool.submit(_chat, url, "read")
            jobs.wait_len(2)
            waiting = pool.submit(_chat, url, "waiting")
            jobs.wait_len(3)
            reading.allow()  # "answered" answers; "read" is read until it is cancelled
            fake.readings.wait_len(2)
            assert _health(url) == (1, 1, 1)
        events = answered.result(timeout=WAIT_S)
        responses = [read.result(timeout=WAIT_S), waiting.result(timeout=WAIT_S)]
    assert [event["choices"][0]["delta"].get("content") for event in events[1:-2]] == ["a", "b"]  # its last step, then stopped
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"
    for response in responses:
        assert response.status_code == 503 and response.json()["error"]["code"] == "server_shutting_down"
    assert fake.readings.items[1].outcome == "cancelled" and fake.closed


def test_a_streamed_client_gets_headers_and_progress_at_once_and_a_short_request_is_answered_during_its_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeEngine({"book?": Script("long", prompt_tokens=10_000, chunks=20, paced=True)})
    service = fake.service(sequences=2)
    jobs = watch_jobs(service.scheduler, monkeypatch)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "book?"}], "stream": True}
    with serving(service) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=WAIT_S) as response:
            # the headers and the role came while the reading waits before its first chunk
            lines = response.iter_lines()
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            role = json.loads(next(lines).removeprefix("data: "))
            assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            (book,) = fake.readings.wait_len(1)
            hi = pool.submit(_chat, url, "hi")
            jobs.wait_len(2)
            book.allow(4)  # "hi" is read after chunk 2 of the book and answered by chunk 4
            answered = hi.result(timeout=WAIT_S)
            assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "ok"
            assert book.chunks_read.items == [1, 2, 3, 4] and book.outcome == ""
            progress = [line for line in itertools.islice(lines, 8) if line]
            assert progress == [f': progress {{"done": {500 * chunk}, "total": 10000}}' for chunk in (1, 2, 3, 4)]
        assert jobs.items[0].job.cancel.wait(WAIT_S), "the reading went on after its client left"
        book.allow()
        assert book.ended.wait(WAIT_S) and book.outcome == "cancelled"


def test_uploads_over_the_memory_budget_push_out_the_least_recently_used_documents() -> None:
    text = "The boat was named the Grey Heron. " * 30  # with its page: 1,315 bytes held (1,050 characters)
    fake = FakeEngine()
    with serving(fake.service(max_document_bytes=3000)) as url:
        def upload(name: str, data: str) -> httpx.Response:
            return httpx.post(f"{url}/v1/documents", files={"file": (name, data.encode())}, timeout=WAIT_S)

        first, second = upload("first.txt", "1" + text).json(), upload("second.txt", "2" + text).json()
        asked = _chat(url, "hi", document_id=first["id"])  # first is now the more recently used
        third = upload("third.txt", "3" + text).json()
        listed = [item["filename"] for item in httpx.get(f"{url}/v1/documents").json()["data"]]
        gone = _chat(url, "hi", document_id=second["id"])
        too_large = upload("huge.txt", "x" * 3000)
    assert asked.status_code == 200 and listed == ["first.txt", "third.txt"]
    assert gone.status_code == 404 and gone.json()["error"]["message"] == (
        f"the document '{second['id']}' was removed to make room for newer uploads; upload it again with POST /v1/documents")
    assert too_large.status_code == 413 and too_large.json()["error"]["message"] == (
        "huge.txt: its text takes 3,265 bytes of memory, more than this server keeps for all documents together "
        "(3,000 bytes); split it into smaller documents")
    assert third["id"] != first["id"]


# ---- uploads ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("read", "read_later"), [("auto", [LaterReading.PASSAGES]), ("fast", [LaterReading.WHOLE]), ("retrieval", [])])
def test_an_upload_is_read_in_the_background_as_its_follow_ups_need_it(read: str, read_later: list[LaterReading]) -> None:
    fake = FakeEngine(saves_readings=True)
    service = fake.service(defaults=UserSettings(read=read))
    asked_to_read: list[LaterReading] = []
    service.scheduler.read_later = lambda request, later: asked_to_read.append(later)
    with serving(service) as url:
        uploaded = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", b"The boat was named the Grey Heron.")},
                              timeout=WAIT_S)
    assert uploaded.status_code == 200 and asked_to_read == read_later


def test_an_uploads_later_reading_is_decided_with_its_requests_bounded_cells() -> None:
    """As a request's (kept_cells): a GPU's whole cache, which a server's sequence cannot hold, is not
    what an upload is read as (sizing.answers_whole_on_gpu)."""
    fake = FakeEngine(saves_readings=True)
    service = fake.service()
    decided_with: list[AskSettings] = []
    fake.later_reading = lambda _document, settings: decided_with.append(settings)
    with serving(service) as url:
        httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", b"The boat was named the Grey Heron.")}, timeout=WAIT_S)
    assert [settings.kept_cells for settings in decided_with] == [service.limits.sequence_cells - 1]


@pytest.mark.parametrize(("filename", "shown"), [("..", "document"), ("/etc/../notes.txt", "notes.txt"),
                                                  ("n" * 300 + ".txt", "n" * 255), ("a\x1bb.txt", "a?b.txt")])
def test_any_upload_name_is_taken_and_shown_safely(server, filename: str, shown: str) -> None:
    url, _ = server
    response = httpx.post(f"{url}/v1/documents", files={"file": (filename, NOTES, "text/plain")})
    assert response.status_code == 200 and response.json()["filename"] == shown


def test_upload_errors_name_the_clients_file_not_the_servers(server) -> None:
    url, _ = server
    for name, data in (("secret-plans.pdf", b""), ("secret-plans.bin", bytes(range(256)) * 40), ("secret-plans.pdf", b"%PDF-1.4 broken")):
        message = httpx.post(f"{url}/v1/documents", files={"file": (name, data)}).json()["error"]["message"]
        assert message.startswith("secret-plans.") and tempfile.gettempdir() not in message and "kvchat-upload" not in message


def test_an_answer_about_a_document_names_its_sources_in_the_kv_block(server, client) -> None:
    url, _ = server
    upload = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()
    about = {"document_id": upload["id"]}
    whole = ask(client, "What was the boat called?", extra_body=about)
    assert whole.choices[0].message.content  # some answer tokens, whose attention names the sources
    sources = whole.model_extra["kv"]["sources"]
    assert 1 <= len(sources) <= 3 and all(set(source) == {"start", "end", "text", "score", "where", "page", "document"} for source in sources)
    text = NOTES.decode()
    assert all(source["text"] == " ".join(text[source["start"] : source["end"]].split()) for source in sources)
    chunks = list(ask(client, "What was the boat called?", stream=True, extra_body=about))
    assert chunks[-1].model_extra["kv"]["sources"] == sources
    assert ask(client, "What was the boat called?", extra_body={**about, "kv_sources": False}).model_extra["kv"]["sources"] == []
    assert ask(client, "What was the boat called?").model_extra["kv"]["sources"] == []  # a plain chat has no document


def test_a_failure_to_find_an_answers_sources_is_a_notice_and_the_answer_stands(server, client, monkeypatch) -> None:
    url, _ = server
    upload = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()

    def failing(*_args: object) -> None:
        raise DecodeError("llama.cpp rejected the batch as invalid", "")

    monkeypatch.setattr(elsewhere, "answer_attention", failing)  # as the engine's own answers' test does (tests/engine/test_sources.py)
    answer = ask(client, "What was the boat called?", extra_body={"document_id": upload["id"]})
    kv = answer.model_extra["kv"]
    assert answer.choices[0].message.content and kv["sources"] == []
    assert kv["notices"] == ["no sources for this answer: llama.cpp rejected the batch as invalid"]


def test_a_request_may_ask_for_a_fast_reading_of_a_new_document(server, client) -> None:
    url, _ = server
    text = b" ".join(b"Crate %d held %d bolts." % (i, 7 * i) for i in range(150))
    upload = httpx.post(f"{url}/v1/documents", files={"file": ("crates.txt", text)}).json()
    about = {"document_id": upload["id"], "kv_budget": 64}
    first = ask(client, "How many bolts did crate 3 hold?", extra_body={**about, "kv_read": "fast"}).model_extra["kv"]
    assert first["read"] == "fast 1/2 layers" and first["kept_tokens"] == 64 < first["prompt_tokens"]
    turns = [{"role": "user", "content": "How many bolts did crate 3 hold?"}, {"role": "assistant", "content": "21"},
             {"role": "user", "content": "And crate 4?"}]
    follow_up = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4, extra_body={**about, "kv_read": "fast"})
    kv = follow_up.model_extra["kv"]
    assert kv["read"] == "fast 1/2 layers" and kv["prompt_tokens"] > first["prompt_tokens"]  # read fast, with its turns
    refused = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": turns, **about, "kv_read": "skim"})
    assert refused.status_code == 400


def test_after_a_fast_answer_the_server_reads_the_document_whole_and_a_follow_up_where_sooner_loads_that_reading(tiny_model_path: Path) -> None:
    readings: list[Reading] = []
    text = b" ".join(b"Crate %d held %d bolts." % (i, 7 * i) for i in range(150))
    with running_server(tiny_model_path, use_cache=True, new_scheduler=recording(readings), budget=64, max_tokens=4,
                        sequences=2) as (url, service):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        about = {"document_id": httpx.post(f"{url}/v1/documents", files={"file": ("crates.txt", text)}).json()["id"], "kv_read": "fast"}
        turns = [{"role": "user", "content": "How many bolts did crate 3 hold?"}]
        first = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4, extra_body=about)
        service.engine.speeds.record("read", 100_000, 0.1)  # the rest of the whole reading: sooner than reading fast
        service.engine.speeds.record("fast", 1_000, 100.0)
        turns += [{"role": "assistant", "content": "21"}, {"role": "user", "content": "And crate 4?"}]
        follow_up = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4, extra_body=about)
        assert service.scheduler.load["reading_on"] == 0
    kv = {"first": first.model_extra["kv"], "follow_up": follow_up.model_extra["kv"]}
    assert kv["first"]["read"] == "fast 1/2 layers" and kv["first"]["kept_tokens"] == 64
    loaded = kv["follow_up"]["loaded_tokens"]
    assert kv["follow_up"]["read"] == "full" and readings[1].notices == [f"loaded the saved reading of crates.txt ({loaded:,} tokens)"]
    assert 0 < first.usage.prompt_tokens - loaded < 64  # the document part of the first prompt: all of it was read and saved
    assert min(readings[1].progress) >= loaded  # nothing of the document read again


@pytest.mark.system
def test_a_document_longer_than_the_models_context_is_answered_streamed_unless_a_method_is_named(server, client) -> None:
    url, service = server
    words = b"The ledger was kept in the blue cabinet. " * 600
    upload = httpx.post(f"{url}/v1/documents", files={"file": ("long.txt", words)}).json()
    assert upload["tokens"] > service.engine.model.shape.n_ctx_train == 4096
    question = [{"role": "user", "content": "Where was the ledger kept?"}]
    answer = client.chat.completions.create(model=MODEL, messages=question, max_tokens=4,
                                            extra_body={"document_id": upload["id"]})
    kv = answer.model_extra["kv"]
    assert kv["method"] == "snapstream" and kv["prompt_tokens"] > 4096 and kv["kept_tokens"] <= 64 + 1
    assert len(kv["notices"]) == 1 and "reading it streamed (snapstream)" in kv["notices"][0]
    chunks = list(client.chat.completions.create(model=MODEL, messages=question, max_tokens=4, stream=True,
                                                 extra_body={"document_id": upload["id"]}))
    assert chunks[-1].model_extra["kv"]["notices"] == kv["notices"]
    with pytest.raises(openai.BadRequestError, match=r"the prompt is [\d,]+ tokens; the model was trained on 4,096 \(hint: .*without kv_method"):
        client.chat.completions.create(model=MODEL, messages=question, max_tokens=4,
                                       extra_body={"document_id": upload["id"], "kv_method": "snapkv"})


def test_several_documents_are_asked_about_together_and_their_reading_is_loaded_the_second_time(tiny_model_path: Path) -> None:
    with running_server(tiny_model_path, use_cache=True, budget=64, max_tokens=8, sequences=1) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        boat = httpx.post(f"{url}/v1/documents", files={"file": ("boat.txt", NOTES)}).json()
        ledger = httpx.post(f"{url}/v1/documents", files={"file": ("ledger.txt", b"The ledger was kept in the blue cabinet.\n" * 30)}).json()

        def answer(question: str, **ids: object):
            return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                  max_tokens=4, extra_body=ids)

        first = answer("Where was the ledger kept, and what was the boat called?", document_ids=[boat["id"], ledger["id"]])
        second = answer("What failed on day four?", document_ids=[boat["id"], ledger["id"]])
        alone = answer("What failed on day four?", document_ids=[boat["id"]])
        kv_first, kv_second, kv_alone = (completion.model_extra["kv"] for completion in (first, second, alone))
        assert kv_first["prompt_tokens"] > boat["tokens"] + ledger["tokens"] and kv_first["loaded_tokens"] == 0
        assert kv_second["loaded_tokens"] > boat["tokens"] + ledger["tokens"]  # the pair's reading, not read again
        assert kv_second["read_tokens"] == kv_second["prompt_tokens"] - kv_second["loaded_tokens"] < 64
        assert kv_alone["prompt_tokens"] < kv_first["prompt_tokens"]
        assert list(kv_first["kept_by_document"]) == ["boat.txt", "ledger.txt"] and kv_alone["kept_by_document"] == {}
        for ids, status, code in (({"document_ids": [boat["id"], "doc-nope"]}, 404, "document_not_found"),
                                  ({"document_ids": []}, 400, None),
                                  ({"document_id": boat["id"], "document_ids": [boat["id"]]}, 400, "invalid_document_ids")):
            response = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **ids})
            assert response.status_code == status and (code is None or response.json()["error"]["code"] == code), response.text


def test_a_bug_is_a_500_logged_once_by_kvchat_and_not_by_uvicorn(server, monkeypatch, caplog) -> None:
    """kvchat's log goes to its log file; uvicorn's error log is what the terminal shows."""
    url, service = server
    monkeypatch.setattr(service.documents, "add", lambda *_args: 1 / 0)
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to caplog's root handler
    uvicorn_log.addHandler(caplog.handler)
    try:
        response = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)})
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
    assert [(record.name, record.exc_info[0]) for record in caplog.records if record.exc_info] == [("kvchat.server.errors", ZeroDivisionError)]


# ---- limits, keys and hints ---------------------------------------------------------------------


def _chunked(data: bytes) -> Iterator[bytes]:
    """A body sent without Content-Length (chunked)."""
    for start in range(0, len(data), 1000):
        yield data[start : start + 1000]


def test_a_chunked_body_over_the_limit_gets_413(tiny_model_path: Path) -> None:
    with running_server(tiny_model_path, budget=64, max_tokens=8, sequences=1, max_body_bytes=1000) as (url, _):
        big = b'{"model": "kvchat-test", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
        chat = httpx.post(f"{url}/v1/chat/completions", content=_chunked(big), headers={"Content-Type": "application/json"})
        boundary = "kvchat-test-boundary"
        form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n\r\n".encode()
                + b"x" * 5000 + f"\r\n--{boundary}--\r\n".encode())
        upload = httpx.post(f"{url}/v1/documents", content=_chunked(form), headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        for response in (chat, upload):
            assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_without_the_key_nothing_of_the_body_matters(tiny_model_path: Path) -> None:
    """The key is checked before the body is read: bad JSON and bodies over the limit get 401."""
    with running_server(tiny_model_path, api_key="sesame", budget=64, max_tokens=8, sequences=1, max_body_bytes=1000) as (url, _):
        bad_json = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        too_large = httpx.post(f"{url}/v1/documents", files={"file": ("big.txt", b"x" * 5000)})
        chunked = httpx.post(f"{url}/v1/documents", content=_chunked(b"x" * 5000), headers={"Content-Type": "multipart/form-data; boundary=x"})
        for response in (bad_json, too_large, chunked):
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("extra", "field_name"), [({"kv_budget": 8}, "kv_budget"), ({"kv_budget": 0}, "kv_budget"),
                                                   ({"kv_budget": 65}, "kv_budget"), ({}, None)])
def test_api_errors_speak_of_request_fields_never_of_cli_options(server, extra: dict, field_name: str | None) -> None:
    url, _ = server
    content = "Hi" if extra else "word " * 5000  # the last: a prompt over the model's trained context
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    response = httpx.post(f"{url}/v1/chat/completions", json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and "--" not in error["message"] and error["param"] == field_name
    if field_name:
        assert "kv_budget" in error["message"] and "16" in error["message"] and "64" in error["message"]
    else:
        assert "/v1/documents" in error["message"]  # the API's hint: a shorter conversation, or a document read streamed


def _readme_python_example() -> str:
    serve_section = (REPO_DIR / "README.md").read_text(encoding="utf-8").split("## A local OpenAI-compatible server")[1]
    return serve_section.split("```python\n")[1].split("```")[0]


def test_the_readme_example_is_the_banners_and_runs_as_printed(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    example = _readme_python_example()
    assert example == PYTHON_EXAMPLE.format(url="http://127.0.0.1:8080", model="default")
    reader = pypdf.PdfReader(REPO_DIR / "kvchat" / "samples" / "marketing_reseller_agreement.pdf")
    writer = pypdf.PdfWriter()
    writer.add_page(reader.pages[11])  # a page short enough for the tiny model
    writer.write(tmp_path / "contract.pdf")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVCHAT_API_KEY", "sesame")
    with running_server(tiny_model_path, api_key="sesame", budget=64, max_tokens=8, sequences=1) as (url, _):
        code = example.replace("http://127.0.0.1:8080", url).replace('model="default"', f'model="{MODEL}"')
        assert code.count(url) == 1 and code.count(MODEL) == 1
        namespace: dict[str, object] = {}
        exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["doc"]["filename"] == "contract.pdf" and namespace["doc"]["pages"] == 1
    assert namespace["answer"].choices[0].finish_reason in ("stop", "length")


def test_a_documents_text_is_what_sources_and_kept_spans_point_into(server, client) -> None:
    url, _ = server
    first = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()
    second = httpx.post(f"{url}/v1/documents", files={"file": ("ledger.txt", b"Item 7 costs 21 dollars.\n" * 30)}).json()
    alone = httpx.get(f"{url}/v1/documents/{first['id']}/text").json()
    assert (alone["text"], alone["filename"], alone["ids"]) == (NOTES.decode().strip(), "notes.txt", [first["id"]])
    assert alone["pages"] == [{"number": 1, "start": 0, "end": len(alone["text"]), "source": "", "kind": ""}]
    kv = ask(client, "What was the boat called?", extra_body={"document_id": first["id"]}).model_extra["kv"]
    assert kv["sources"] and all(source["text"] == " ".join(alone["text"][source["start"]:source["end"]].split())
                                 for source in kv["sources"])
    assert kv["kept_spans"] and all(0 <= start < end <= len(alone["text"]) for start, end in kv["kept_spans"])
    assert len(kv["attention"]) == 100 and abs(sum(kv["attention"]) - 1) < 1e-3
    both_ids = [first["id"], second["id"]]
    both = httpx.get(f"{url}/v1/documents/{','.join(both_ids)}/text").json()
    assert both["filename"] == "notes.txt, ledger.txt" and [page["source"] for page in both["pages"]] == ["notes.txt", "ledger.txt"]
    kv = ask(client, "How much is item 7?", extra_body={"document_ids": both_ids}).model_extra["kv"]
    assert all(source["text"] == " ".join(both["text"][source["start"]:source["end"]].split()) for source in kv["sources"])
    missing = httpx.get(f"{url}/v1/documents/doc-nothing/text")
    assert missing.status_code == 404 and "no document 'doc-nothing'" in missing.json()["error"]["message"]


def test_a_documents_text_keeps_its_control_characters_escaped_as_json_escapes_them(server) -> None:
    """The API hands programs the text as it is (the offsets point into it); its ESC and BEL travel
    as JSON's escapes, never as raw bytes, and the page shows the text through textContent."""
    url, _ = server
    text = "The title is \x1b]0;pwned\x07 and the bell \x07 rings. Item 7 costs 21 dollars."
    stored = httpx.post(f"{url}/v1/documents", files={"file": ("title.txt", text.encode())}).json()
    response = httpx.get(f"{url}/v1/documents/{stored['id']}/text")
    assert response.headers["content-type"] == "application/json"
    assert b"\x1b" not in response.content and b"\x07" not in response.content
    assert b"\\u001b]0;pwned\\u0007" in response.content and response.json()["text"] == text


def test_the_page_is_served_and_other_origins_are_refused_unless_allowed(tiny_model_path: Path) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with running_server(tiny_model_path, budget=64, max_tokens=8, sequences=1) as (url, _):
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and '<script src="/static/app.js"' in page.text
        assert httpx.get(f"{url}/static/app.js").headers["content-type"].startswith("text/javascript")
        refused = httpx.options(f"{url}/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in refused.headers
    with running_server(tiny_model_path, allowed_origins=["https://app.example"], budget=64, max_tokens=8, sequences=1) as (url, _):
        allowed = httpx.options(f"{url}/v1/chat/completions", headers=preflight)
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://app.example"


def test_a_requests_method_and_stream_are_made_as_every_front_end_makes_them(tiny_model_path: Path) -> None:
    from kvchat.server.schemas import ChatCompletionRequest

    defaults = UserSettings(chunk=128, recent=16, kernel=5, spans="none")  # kvchat serve --chunk 128 --recent 16 --kernel 5 …
    with running_server(tiny_model_path, defaults=defaults, budget=64, max_tokens=8, sequences=1) as (_, service):
        asked = [ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "Hi"}], kv_budget=budget, kv_method=method)
                 for budget, method in ((16, None), (64, "full"))]
        small, full = (service.settings_for(request) for request in asked)
        assert small.method == ask_settings(UserSettings(budget=16, kernel=5, spans="none")).method
        assert full.method == ask_settings(UserSettings(method="full", budget=64)).method  # the options full has not stay with snapkv
        assert (small.method.window, small.stream.chunk, small.stream.recent, small.select) == (8, 128, 16, "question")


def test_a_requests_system_message_or_else_the_servers_is_the_document_prompts_system(tiny_model_path: Path) -> None:
    from kvchat.server.schemas import ChatCompletionRequest

    with running_server(tiny_model_path, defaults=UserSettings(system="Answer in French."), budget=64, max_tokens=8, sequences=1) as (url, service):
        plain = ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        own = ChatCompletionRequest(model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        assert (service.settings_for(plain).system, service.settings_for(own).system) == ("Answer in French.", "Be brief.")
        about = {"document_id": httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()["id"]}
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        french = ask(client, "What was the boat called?", extra_body=about).usage.prompt_tokens
        brief = client.chat.completions.create(model=MODEL, max_tokens=4, extra_body=about, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What was the boat called?"}]).usage.prompt_tokens
        assert french > brief  # each prompt holds its own system prompt, the server's the longer


def test_a_long_question_beside_a_document_is_refused_before_anything_is_read(client, server, contexts_made) -> None:
    """A 10,000-character question beside a document is refused before a context is made for it:
    no context larger than the model was trained on (11,520 cells for it, 1,001,472 for 1 MB)."""
    url, _ = server
    uploaded = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, "why " * 2500, extra_body={"document_id": uploaded["id"]})
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": "the question is 10,021 tokens; a question may take at most 1,024 (a quarter of the 4,096 the model "
                   "was trained on) (hint: ask a shorter question: long text belongs in the document)",
        "type": "invalid_request_error", "param": None, "code": "invalid_request"}
    assert contexts_made == []


def test_a_follow_up_whose_earlier_turns_pass_a_sequences_room_is_refused_before_anything_is_read(client, server, contexts_made) -> None:
    """Earlier turns are pinned whole beside the kept entries: turns over the sequence's room
    (an answer in parts is long) are refused by the same check, before the document is read."""
    url, service = server
    uploaded = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()
    turns = [{"role": "user", "content": "why " * 150}, {"role": "assistant", "content": "why " * 150},
             {"role": "user", "content": "And the radio?"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=turns, max_tokens=8, extra_body={"document_id": uploaded["id"]})
    held = service.limits.sequence_cells - 1
    assert re.fullmatch(rf"the prompt keeps 1,[\d]{{3}} tokens for its answer \(1,[\d]{{3}} of them earlier turns\); "
                        rf"a conversation holds {held:,} \(hint: start a new conversation, or send fewer earlier turns\)",
                        refused.value.body["message"])
    assert contexts_made == []



@pytest.mark.parametrize("request_fields, param", [
    ({"messages": [{"role": "user", "content": "what \ud800"}]}, "messages.0.content"),
    ({"messages": [{"role": "system", "content": "Be brief \udfff"}, {"role": "user", "content": "Hi"}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, "messages.0.content"),
    ({"model": "kvchat-\ud800"}, "model"),
    ({"document_id": "doc-\ud800"}, "document_id"),
    ({"document_ids": ["doc-\ud800"]}, "document_ids"),
])
def test_a_lone_surrogate_in_a_text_field_is_a_400_naming_the_field(server, request_fields, param) -> None:
    """JSON's "\\ud800" decodes to half a UTF-16 pair, which no encoder takes; before, the server
    answered 500 ("internal error: 'utf-8' codec can't encode…"). Sent as JSON escapes (the
    openai client cannot encode such a string at all)."""
    url, _ = server
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], **request_fields}
    response = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": f"{param}: a lone surrogate (\\ud800 to \\udfff without its pair) is not text; send the character itself "
                   "or its whole UTF-16 pair", "type": "invalid_request_error", "param": param, "code": "invalid_request"}


def test_a_whole_surrogate_pair_is_text(server) -> None:
    url, _ = server
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Smile \ud83d\ude00"}]}
    response = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert '\\ud83d\\ude00' in json.dumps(body) and response.status_code == 200, response.text


PAGE_POLICY = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
               "base-uri 'none'; frame-ancestors 'none'")


@pytest.mark.parametrize("path", ["/", "/static/index.html", "/static/app.js", "/static/app.css", "/static/absent.js", "/v1/models"])
def test_every_route_of_the_page_and_its_files_sends_the_same_security_headers(server, path) -> None:
    """/static/index.html serves the page with the policy, nosniff and framing rule `/` sends."""
    url, _ = server
    headers = httpx.get(f"{url}{path}").headers
    assert (headers["content-security-policy"], headers["x-content-type-options"], headers["x-frame-options"]) == (
        PAGE_POLICY, "nosniff", "DENY")


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_api_docs_load_nothing_from_another_origin(server, path) -> None:
    """/docs loads Swagger UI from kvchat's own files (fastapi-offline), not a CDN, and its policy
    allows nothing from elsewhere."""
    url, _ = server
    page = httpx.get(f"{url}{path}")
    assert page.status_code == 200 and "http://" not in page.text and "https://" not in page.text
    policy = page.headers["content-security-policy"]
    assert policy.startswith("default-src 'self'; script-src 'self' 'unsafe-inline';") and "frame-ancestors 'none'" in policy
    loaded = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert loaded and all(link.startswith("/static-offline-docs/") for link in loaded)
    assert all(httpx.get(f"{url}{link}").status_code == 200 for link in loaded)


@pytest.mark.parametrize("field, value, expected", [
    ("kv_budget", "512", "kv_budget should be a valid integer, not '512' (hint: use 16 to 64, or leave it out for 64)"),
    ("kv_budget", True, "kv_budget should be a valid integer, not True (hint: use 16 to 64, or leave it out for 64)"),
    ("kv_budget", 48.0, "kv_budget should be a valid integer, not 48.0 (hint: use 16 to 64, or leave it out for 64)"),
    ("kv_sources", "false", "kv_sources is true or false, not 'false' (hint: true is the default)"),
    ("kv_sources", 0, "kv_sources is true or false, not 0 (hint: true is the default)"),
])
def test_kvchats_request_fields_are_strict(client: openai.OpenAI, field, value, expected) -> None:
    """A kv_ field of another type ("512", true for a budget) is refused, not converted."""
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, extra_body={field: value})
    assert refused.value.body == {"message": expected, "type": "invalid_request_error", "param": field, "code": "invalid_request"}


@pytest.mark.system
def test_health_names_a_gguf_path_by_its_file_name_as_the_models_list_does(tiny_model_path: Path) -> None:
    """/health needs no key; before, it (and /v1/models) named a model given by its path by that path."""
    with serve_process(tiny_model_path) as served:
        health = httpx.get(f"{served.url}/health").json()
        models = httpx.get(f"{served.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert health["model"] == models["data"][0]["id"] == tiny_model_path.name == "tiny-qwen2.gguf"
    assert str(tiny_model_path.parent) not in "".join(served.stderr[1:])  # nor do the banner's examples
