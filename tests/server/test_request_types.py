"""The OpenAI fields kvchat reads are as strict as its kv_ fields, and as OpenAI's own API: a
string, a float or true for max_tokens, "yes" for stream are a 400 naming the field, not guessed;
a kv_ field kvchat does not take is a 400 naming it, while other unknown fields (OpenAI's clients
send many) are still ignored (issue 67, row 10). Over a real socket, with the openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.fake_engine import FakeEngine
from tests.server_harness import serving

MODEL = "kvchat-test"
QUESTION = [{"role": "user", "content": "Who?"}]


@pytest.fixture(scope="module")
def url():
    with serving(FakeEngine().service()) as base:
        yield base


def post(url: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, **fields}, timeout=30)


@pytest.mark.parametrize(("fields", "param", "said"), [
    ({"max_tokens": "10"}, "max_tokens", "max_tokens: Input should be a valid integer"),
    ({"max_tokens": 10.0}, "max_tokens", "max_tokens: Input should be a valid integer"),
    ({"max_tokens": True}, "max_tokens", "max_tokens: Input should be a valid integer"),  # a 1-token answer before
    ({"max_completion_tokens": "10"}, "max_completion_tokens", "max_completion_tokens: Input should be a valid integer"),
    ({"stream": "yes"}, "stream", "stream: Input should be a valid boolean"),  # streamed before
    ({"stream": 1}, "stream", "stream: Input should be a valid boolean"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
     "stream_options.include_usage: Input should be a valid boolean"),
    ({"temperature": "0.5"}, "temperature", "temperature: Input should be a valid number"),
    ({"top_p": True}, "top_p", "top_p: Input should be a valid number"),
    ({"seed": "7"}, "seed", "seed: Input should be a valid integer"),
    ({"n": 1.0}, "n", "n: Input should be a valid integer"),
])
def test_a_wrong_type_for_an_openai_field_is_a_400_naming_it(url, fields, param, said) -> None:
    refused = post(url, **fields)
    assert refused.status_code == 400
    assert refused.json()["error"] == {"message": said, "type": "invalid_request_error", "param": param, "code": "invalid_request"}


def test_the_openai_fields_of_the_right_type_are_taken(url) -> None:
    """temperature 1, an int where OpenAI's schema says number, is a number."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=1, seed=7, top_p=1, n=1)
    assert answer.choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None


def test_a_seed_llama_cpp_would_cut_to_32_bits_is_refused(url) -> None:
    refused = post(url, seed=2**40)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "seed should be less than or equal to 4294967294, not 1099511627776 (hint: leave it unset)"


@pytest.mark.parametrize("fields", [{"kv_window": 16}, {"kv_n_batch": 256}, {"kv_system": "Be brief."}, {"kv_temperature": 0.5},
                                    {"kv_budget": 64, "kv_bogus": 1}])
def test_an_unknown_kv_field_is_a_400_naming_it(url, fields) -> None:
    """Ignored before: a client believed it had set the window, the system prompt or the temperature."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    unknown = [name for name in fields if name != "kv_budget"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, extra_body=fields)
    error = refused.value.body
    assert error["param"] == unknown[0] and error["message"].startswith(f"unknown {', '.join(unknown)} (hint: ")
    assert "the kv_ fields are kv_budget, kv_method, kv_read, kv_in_parts, kv_sources" in error["message"]


def test_an_unknown_kv_field_for_an_openai_setting_names_the_openai_field(url) -> None:
    refused = post(url, kv_temperature=0.5, kv_system="Be brief.")
    assert refused.json()["error"]["message"] == (
        "unknown kv_temperature, kv_system (hint: use temperature for kv_temperature, a system message for kv_system; "
        "the kv_ fields are kv_budget, kv_method, kv_read, kv_in_parts, kv_sources)")


def test_other_unknown_fields_and_the_old_kv_name_are_still_taken(url) -> None:
    taken = post(url, max_tokens=4, frequency_penalty=0, presence_penalty=0, user="me", logit_bias={}, metadata={"a": "b"},
                 kv_whole="off", kv_budget=64)
    assert taken.status_code == 200, taken.text
