"""`kvchat serve` over real sockets with the official `openai` client, on the tiny random GGUF.

The tiny model's text is noise; these tests check the protocol, the bookkeeping and the
concurrency. What the answers say is checked on the real model (test_server_real.py).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import openai
import pytest

from kvchat.engine import KvLayout
from kvchat.server.schemas import ChatCompletionRequest
from server_harness import running_server

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


def test_eight_clients_five_requests_each_all_succeed(client: openai.OpenAI) -> None:
    def client_session(index: int) -> list[str]:
        return [ask(client, f"client {index} request {turn}").choices[0].finish_reason for turn in range(5)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client_session, range(8)))
    assert all(reason in ("stop", "length") for finishes in results for reason in finishes)
    assert sum(len(finishes) for finishes in results) == 40


def test_a_follow_up_continues_its_conversation(client: openai.OpenAI, server) -> None:
    _, service = server
    first = ask(client, "Remember me")
    history = [
        {"role": "user", "content": "Remember me"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Who am I?"},
    ]
    continued = service.conversation_for(ChatCompletionRequest(model=MODEL, messages=history))
    unrelated = service.conversation_for(ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "Hi"}]))
    assert continued in service._conversations.values() and unrelated not in service._conversations.values()
    follow_up = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8)
    assert follow_up.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_server_with_flash_attention_on_answers_about_documents(tiny_model_path: Path, tmp_path: Path) -> None:
    """Readings are made, saved and moved into the shared context with flash attention on (V not
    transposed): a shared context laid out otherwise refuses those states."""
    layout = KvLayout(flash_attn=True)
    with running_server(tiny_model_path, use_cache=True, budget=64, max_tokens=8, sequences=2, layout=layout) as (url, service):
        assert service.scheduler.decoder.ctx.settings.flash_attn
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        document = httpx.post(f"{url}/v1/documents", files={"file": ("notes.txt", NOTES)}).json()["id"]
        history = [{"role": "user", "content": "What was the boat called?"}]
        for question in ("And the budget?", "And the radio?"):  # the later ones load the saved reading
            answer = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, extra_body={"document_id": document})
            assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens > 0
            history += [{"role": "assistant", "content": answer.choices[0].message.content}, {"role": "user", "content": question}]


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
