"""GET /v1/settings, what the chat page builds its settings form from: each setting a request may
set, with the bounds, choices and default of this server. Checked against the declarations
(UserSettings, the request's fields, the server's limits) and against what a chat request is
really taken or refused with, on the fake engine over a real socket."""

from __future__ import annotations

import httpx
import pytest

from kvchat.engine import UserSettings, choices, setting_names
from kvchat.policy import MIN_BUDGET
from kvchat.server.schemas import REQUEST_SETTINGS, SERVED_CHOICES, SETTING_FIELDS, ChatCompletionRequest
from tests.fake_engine import FakeEngine
from tests.server_harness import serving

MODEL = "kvchat-test"
QUESTION = [{"role": "user", "content": "Who?"}]
BUDGET, MAX_TOKENS = 64, 16  # this server's limits, below the settings' own


@pytest.fixture(scope="module")
def url():
    with serving(FakeEngine().service(budget=BUDGET, max_tokens=MAX_TOKENS)) as base:
        yield base


@pytest.fixture(scope="module")
def served(url) -> dict[str, dict]:
    response = httpx.get(f"{url}/v1/settings", timeout=30)
    assert response.status_code == 200 and response.json()["object"] == "list"
    return {setting["field"]: setting for setting in response.json()["data"]}


def post(url: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, **fields}, timeout=30)


def test_every_setting_a_request_sets_is_served_with_this_servers_bounds(served) -> None:
    assert list(served) == list(REQUEST_SETTINGS) and all(field in ChatCompletionRequest.model_fields for field in served)
    assert {field for field in served if field.startswith("kv_")} == set(SETTING_FIELDS)
    assert [served[f"kv_{name}"]["name"] for name in setting_names(served=True)] == setting_names(served=True)
    assert {"temperature", "max_tokens", "seed"} <= set(served)
    assert {setting["kind"] for setting in served.values()} <= {"integer", "number", "boolean", "choice"}
    budget, max_tokens, temperature = served["kv_budget"], served["max_tokens"], served["temperature"]
    assert (budget["kind"], budget["minimum"], budget["maximum"], budget["default"]) == ("integer", MIN_BUDGET, BUDGET, BUDGET)
    assert (max_tokens["minimum"], max_tokens["maximum"], max_tokens["default"]) == (1, MAX_TOKENS, MAX_TOKENS)
    assert (temperature["kind"], temperature["minimum"], temperature["maximum"], temperature["default"]) == ("number", 0, 2, 0)
    assert served["kv_method"]["choices"] == list(SERVED_CHOICES["method"])
    assert served["kv_read"]["choices"] == list(choices("read")) and "retrieval" in served["kv_read"]["choices"]
    assert served["kv_in_parts"]["default"] == UserSettings().in_parts
    assert served["kv_sources"]["kind"] == "boolean" and served["kv_sources"]["choices"] is None
    for setting in served.values():
        assert setting["description"].startswith(UserSettings.model_fields[setting["name"]].description)


def _taken_and_refused(setting: dict) -> tuple[list[object], list[object]]:
    """Values the server must take of `setting`, and values it must refuse, from what it serves."""
    if setting["kind"] == "boolean":
        return [True, False], ["yes"]
    if setting["kind"] == "choice":
        return setting["choices"], ["bogus"]
    step = 1 if setting["kind"] == "integer" else 0.5
    least, most = setting["minimum"], setting["maximum"]
    assert least is not None and most is not None, f"{setting['field']}: a number the page offers has both bounds"
    return [least, most], [least - step, most + step]


@pytest.mark.parametrize("field", list(REQUEST_SETTINGS))
def test_the_served_bounds_and_choices_are_what_a_chat_request_may_send(url, served, field) -> None:
    taken, refused = _taken_and_refused(served[field])
    for value in taken:
        answer = post(url, max_tokens=4, **{field: value}) if field != "max_tokens" else post(url, max_tokens=value)
        assert answer.status_code == 200, f"{field}={value!r}: {answer.text}"
    for value in refused:
        answer = post(url, **{field: value})
        assert answer.status_code == 400 and field in answer.json()["error"]["message"], f"{field}={value!r}: {answer.text}"


def test_the_settings_need_the_api_key_when_one_is_set() -> None:
    with serving(FakeEngine().service(), api_key="sesame") as base:
        assert httpx.get(f"{base}/v1/settings", timeout=30).status_code == 401
        assert httpx.get(f"{base}/v1/settings", headers={"Authorization": "Bearer sesame"}, timeout=30).status_code == 200
