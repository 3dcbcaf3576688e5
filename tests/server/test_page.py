"""The chat page of `kvchat serve`, in a real headless Chromium (Debian's, driven by Playwright):
upload, ask, the answer streaming in, a source opening the document at its passage; with an API
key; a document's markup shown as text. Screenshots go to test-artifacts/ (light and dark)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai
import pytest

from kvchat.engine import UserSettings, choices, setting_names, value_type
from kvchat.server.schemas import SERVED_CHOICES, ChatCompletionRequest
from tests.conftest import REPO_DIR
from tests.fake_engine import FakeEngine
from tests.server_harness import running_server, serving
from tests.system_tools import system_tool
from tests.server.test_server_real import TRIP

pytestmark = pytest.mark.system

SAMPLE_PDF = REPO_DIR / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"
ARTIFACTS = REPO_DIR / "test-artifacts"
HOSTILE = "<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script> The boat was named the Grey Heron.\n" * 12


@pytest.fixture(scope="module")
def browser():
    chromium = system_tool("chromium", "chromium")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield launched
        launched.close()


def new_page(browser, url: str):
    page = browser.new_page(color_scheme="light", viewport={"width": 1400, "height": 900})
    page.on("dialog", lambda dialog: pytest.fail(f"the page opened a dialog: {dialog.message}"))
    page.goto(f"{url}/")
    return page


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def page_asking_about(browser, url: str, path: Path, shown: str):
    """A new page with the document at `path` uploaded and asked about (`shown`: its name as listed)."""
    page = new_page(browser, url)
    page.wait_for_selector("body[data-ready=yes]")
    page.set_input_files("#file", str(path))
    page.wait_for_selector(f"#documents li:has-text('{shown}') input:checked")
    return page


def ask_on(page, question: str) -> None:
    page.fill("#question", question)
    page.click("#send")
    page.wait_for_selector("#messages li.assistant .stats")  # the final chunk arrived, with its kv block


def test_upload_ask_and_open_a_source_at_its_passage(browser, tiny_model_path: Path) -> None:
    with running_server(tiny_model_path, budget=64, max_tokens=12, sequences=2) as (url, _):
        page = page_asking_about(browser, url, SAMPLE_PDF, SAMPLE_PDF.name)
        assert "tok" in page.inner_text("#documents")
        ask_on(page, "Who are the parties?")
        answer = page.locator("#messages li.assistant")
        sources = answer.locator(".sources button")
        assert sources.count() >= 1 and "prompt" in answer.locator(".stats").inner_text()
        label = sources.first.inner_text()
        quoted = label.split(" · “", 1)[1].removesuffix("”")
        sources.first.click()
        mark = page.locator("#document-text mark")
        mark.wait_for()
        assert " ".join(mark.inner_text().split()) == quoted
        assert page.locator("#document-text .kept").count() >= 1 and page.locator("#strip span").count() == 100
        screenshot(page, "page-light")
        page.emulate_media(color_scheme="dark")
        page.reload()  # the conversation is kept in the browser
        page.wait_for_selector("#messages li.assistant .sources button")
        assert page.locator("#messages li.user").inner_text() == "Who are the parties?"
        page.locator("#messages li.assistant .sources button").first.click()
        page.locator("#document-text mark").wait_for()
        screenshot(page, "page-dark")


def test_a_summary_is_answered_from_the_parts_unless_the_settings_say_off(browser, tiny_model_path: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The boat was named the Grey Heron. The radio failed on day four.\n" * 12)
    with running_server(tiny_model_path, budget=64, max_tokens=8, sequences=2) as (url, _):
        page = page_asking_about(browser, url, notes, "notes.txt")
        ask_on(page, "Summarize this document.")
        summary = page.locator("#messages li.assistant").last
        assert "a question about the whole document" in summary.inner_text()
        page.click("#settings summary")
        page.select_option("#set-in-parts", "off")
        ask_on(page, "Summarize this document.")
        page.locator("#messages li.assistant .stats").nth(1).wait_for()  # the second answer's final chunk
        assert "a question about the whole document" not in page.locator("#messages li.assistant").last.inner_text()


def expected_field(name: str, limits: dict[str, int]) -> dict[str, object]:
    """What the form's field of the setting `name` should be, from its declaration, its request
    field's and this server's `limits`: an input's type, step, min and max, or a select's values."""
    kind = value_type(name)
    if kind is bool or choices(name):
        values = ["true", "false"] if kind is bool else list(SERVED_CHOICES.get(name, choices(name)))
        return {"tag": "SELECT", "values": ["", *values]}
    field = ChatCompletionRequest.model_fields.get(f"kv_{name}") or ChatCompletionRequest.model_fields[name]
    declared = [*UserSettings.model_fields[name].metadata, *field.metadata]
    least = max(each.ge for each in declared if hasattr(each, "ge"))
    most = min([*(each.le for each in declared if hasattr(each, "le")), *([limits[name]] if name in limits else [])])
    return {"tag": "INPUT", "type": "number", "step": "1" if kind is int else "any", "min": str(least), "max": str(most)}


def shown_field(page, request_field: str) -> dict[str, object]:
    """The form's field named `request_field`, as expected_field says one, with its label's text and title."""
    return page.locator(f"#settings [name='{request_field}']").evaluate("""(field) => ({
        tag: field.tagName, type: field.type, step: field.step, min: field.min, max: field.max,
        values: field.tagName === "SELECT" ? [...field.options].map((option) => option.value) : undefined,
        labels: [...field.labels].map((label) => [label.textContent, label.title]), placeholder: field.placeholder})""")


def test_the_settings_form_is_the_servers_settings_and_its_values_are_sent(browser) -> None:
    """Each setting a request sets has its field in the form, named as its request field, labelled
    with its description, with the kind, bounds and choices its declaration and this server's limits
    give it (the form written by hand had a budget from 64, no retrieval, no method). A value set
    is sent with the conversation's questions, the others left out; a new conversation has its own."""
    limits = {"budget": 64, "max_tokens": 16}
    served = {f"kv_{name}": name for name in setting_names(served=True)} | {"temperature": "temperature", "max_tokens": "max_tokens"}
    with serving(FakeEngine().service(**limits)) as url:
        page = new_page(browser, url)
        page.wait_for_selector("body[data-ready=yes]")
        page.click("#settings summary")
        screenshot(page, "page-settings")
        assert set(served) <= set(page.eval_on_selector_all("#settings [name]", "(fields) => fields.map((field) => field.name)"))
        for request_field, name in served.items():
            shown, expected = shown_field(page, request_field), expected_field(name, limits)
            assert {key: shown[key] for key in expected} == expected, request_field
            [(text, title)] = shown["labels"]
            assert text and title.startswith(UserSettings.model_fields[name].description), request_field
        assert shown_field(page, "kv_budget")["placeholder"] == "64"  # the server's, where unset
        page.fill("[name=kv_budget]", "32")
        page.press("[name=kv_budget]", "Tab")  # a number is taken once the field is left
        page.select_option("[name=kv_read]", "retrieval")
        page.select_option("[name=kv_sources]", "false")
        with page.expect_request("**/v1/chat/completions") as sent:
            ask_on(page, "Who?")
        body = sent.value.post_data_json
        assert {key: body[key] for key in body if key not in ("model", "stream", "messages")} == {
            "kv_budget": 32, "kv_read": "retrieval", "kv_sources": False}
        page.click("#new-conversation")
        assert page.input_value("[name=kv_budget]") == "" and page.input_value("[name=kv_read]") == ""
        with page.expect_request("**/v1/chat/completions") as sent:
            page.fill("#question", "And then?")
            page.click("#send")
        assert not any(key.startswith("kv_") for key in sent.value.post_data_json)
        page.click("#conversations button.open:has-text('Who?')")
        assert page.input_value("[name=kv_budget]") == "32" and page.input_value("[name=kv_sources]") == "false"


def test_the_page_asks_for_the_api_key_once(browser, tiny_model_path: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The boat was named the Grey Heron. The budget was 4,350 euros.\n" * 10)
    with running_server(tiny_model_path, api_key="sesame", budget=64, max_tokens=8, sequences=2) as (url, _):
        assert httpx.get(f"{url}/").status_code == 200 and httpx.get(f"{url}/v1/models").status_code == 401
        page = browser.new_page()
        page.goto(f"{url}/")
        page.locator("#key-dialog[open]").wait_for()
        page.fill("#key-input", "sesame")
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready=yes]")
        page.set_input_files("#file", str(notes))
        page.wait_for_selector("#documents li:has-text('notes.txt') input:checked")
        ask_on(page, "What was the boat called?")
        assert page.locator("#key-dialog[open]").count() == 0  # asked once, kept for the session


def test_a_documents_markup_is_shown_as_text(browser, tiny_model_path: Path, tmp_path: Path) -> None:
    hostile = tmp_path / "<img src=x onerror=alert(1)>.txt"
    hostile.write_text(HOSTILE)
    with running_server(tiny_model_path, budget=64, max_tokens=8, sequences=2) as (url, _):
        page = page_asking_about(browser, url, hostile, "onerror=alert(1)>.txt")
        ask_on(page, "<script>window.pwned=3</script> What was the boat called?")
        page.click("#messages li.assistant button:has-text('What the model kept')")
        page.locator("#document-text span").first.wait_for()
        assert page.inner_text("#document-text").startswith('<img src=x onerror="window.pwned=1"> <script>')
        assert page.locator("#document-text img, #document-text script, #messages script, #documents img").count() == 0
        assert page.locator("#messages li.user").inner_text().startswith("<script>")
        assert page.evaluate("window.pwned") is None
        headers = httpx.get(f"{url}/").headers
        assert "default-src 'self'" in headers["content-security-policy"]


@pytest.mark.real_model
def test_on_a_real_model_the_page_answers_with_the_apis_answer_and_sources(browser, small_model_path: Path, tmp_path: Path) -> None:
    trip = tmp_path / "trip.txt"
    trip.write_bytes(TRIP)
    question = "What was the boat called?"
    with running_server(small_model_path, budget=256, max_tokens=24, sequences=2) as (url, _):
        page = page_asking_about(browser, url, trip, "trip.txt")
        ask_on(page, question)
        shown = page.locator("#messages li.assistant")
        (document,) = httpx.get(f"{url}/v1/documents").json()["data"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        api = client.chat.completions.create(model="kvchat-test", messages=[{"role": "user", "content": question}],
                                             extra_body={"document_id": document["id"]})
        assert "Grey Heron" in api.choices[0].message.content
        assert shown.locator(".answer").inner_text().strip() == api.choices[0].message.content.strip()
        labels = [f"{source['where']} · “{source['text']}”" for source in api.model_extra["kv"]["sources"]]
        assert labels and shown.locator(".sources button").all_inner_texts() == labels
