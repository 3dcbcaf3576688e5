"""`kvchat serve` on the small real model: answers from the right document, conversations that
stay apart while interleaved, and a client that goes away mid-answer (the waiting line and the
rest of the scheduling are tested on the fake engine, in test_server.py)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import httpx
import openai
import pytest

from kvchat.engine import KvLayout
from kvchat.events import Done
from tests.server_harness import running_server, watch_jobs

pytestmark = pytest.mark.real_model
MODEL = "kvchat-test"
TRIP = b"""Field notes. Day 1: the team left Port Ellery on the boat Grey Heron at 7:40.
Day 2: we reached the island of Vell. Day 4: the radio failed; Marta repaired it with a fuse.
Day 5: we returned. The expedition budget closed at 4,350 euros."""
CAKE = b"""Grandmother's lemon cake. Beat 3 eggs with 200 g of sugar. Fold in 250 g of flour and the
zest of two lemons. Bake at 180 degrees Celsius for 35 minutes. Serve with whipped cream."""


@pytest.fixture(scope="module")
def server(small_model_path: Path):
    with running_server(small_model_path, budget=256, max_tokens=200, sequences=4, max_waiting=4) as running:
        yield running


def _conversation(client: openai.OpenAI, document_id: str, questions: list[str]) -> list[str]:
    """Ask in turn, sending the history back as an OpenAI client does."""
    messages: list[dict[str, str]] = []
    answers = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        completion = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=40, extra_body={"document_id": document_id}
        )
        answer = completion.choices[0].message.content
        messages.append({"role": "assistant", "content": answer})
        answers.append(answer)
    return answers


def test_two_interleaved_conversations_stay_apart(server) -> None:
    url, _ = server
    trip = httpx.post(f"{url}/v1/documents", files={"file": ("trip.txt", TRIP)}).json()["id"]
    cake = httpx.post(f"{url}/v1/documents", files={"file": ("cake.txt", CAKE)}).json()["id"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        trip_answers = pool.submit(_conversation, client, trip, ["What was the boat called?", "How much was the budget?"])
        cake_answers = pool.submit(_conversation, client, cake, ["How many eggs are needed?", "At what temperature is it baked?"])
        boat, budget = trip_answers.result()
        eggs, temperature = cake_answers.result()
    assert "Grey Heron" in boat and ("4,350" in budget or "4350" in budget)
    assert ("3" in eggs or "three" in eggs.lower()) and "180" in temperature


def test_flash_attention_with_a_quantized_kv_cache(small_model_path: Path) -> None:
    """--flash-attn on --cache-type-k q8_0 --cache-type-v q8_0: scored by the query probe from
    the rotated q8_0 keys, moved into a q8_0 shared context, and still right."""
    layout = KvLayout(flash_attn=True, type_k="q8_0", type_v="q8_0")
    with running_server(small_model_path, budget=256, max_tokens=40, sequences=2, layout=layout) as (url, _):
        trip = httpx.post(f"{url}/v1/documents", files={"file": ("trip.txt", TRIP)}).json()["id"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        boat, budget = _conversation(client, trip, ["What was the boat called?", "How much was the budget?"])
    assert "Grey Heron" in boat and ("4,350" in budget or "4350" in budget)


def _open_stream(http: httpx.Client, url: str, question: str) -> httpx.Response:
    body = {"model": MODEL, "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": question}]}
    request = http.build_request("POST", f"{url}/v1/chat/completions", json=body)
    return http.send(request, stream=True)


def test_a_client_that_goes_away_frees_its_sequence(server, monkeypatch: pytest.MonkeyPatch) -> None:
    url, service = server
    jobs = watch_jobs(service.scheduler, monkeypatch)
    with httpx.Client(timeout=120) as http:
        response = _open_stream(http, url, "Write a very long story about a lighthouse keeper.")
        lines = response.iter_lines()  # kept: a dropped line iterator closes the response
        chunks = []
        while len(chunks) < 4:
            line = next(lines)
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
        (watched,) = jobs.items
        assert not any(isinstance(item, Done) for item in watched.emitted.items)  # still answering: 4 of 200 tokens
        assert httpx.get(f"{url}/health").json()["answering"] == 1
        response.close()
    done = watched.emitted.ended(timeout_s=5)[-1]  # 200 tokens would take longer than that
    assert isinstance(done, Done) and done.stats.stop_reason == "cancelled" and done.stats.generated_tokens < 200
    assert httpx.get(f"{url}/health").json()["answering"] == 0
