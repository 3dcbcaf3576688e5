"""Every registered method through the same checks: its plans on synthetic votes, and a whole
conversation on the tiny model. A new method is covered by adding it to the registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation, StreamSettings
from kvchat.engine.answering import route
from kvchat.errors import SettingsError
from kvchat.events import Done, Pruned
from kvchat.policy import METHODS, Method, method_carrying, method_named, method_options, methods_help

BUDGET, WINDOW, N_TOKENS = 96, 16, 700
ALL = pytest.mark.parametrize("name", list(METHODS))


def votes_for(n_tokens: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((2, 4, n_tokens), dtype=np.float64)


@ALL
def test_the_registry_builds_it_by_name_and_refuses_an_option_it_has_not(name: str) -> None:
    method = method_named(name, budget=BUDGET, window=WINDOW)
    assert isinstance(method, Method) and type(method) is METHODS[name] and method.name == name
    assert (method.budget, method.window) == (BUDGET, WINDOW)
    assert method_named(name, **method_options(method)) == method
    assert f"{name} (" in methods_help()
    with pytest.raises(SettingsError) as refused:
        method_named(name, budget=BUDGET, no_such_option=1)
    assert refused.value.one_line() == (
        f"{name} has no option no_such_option (hint: {name} takes {', '.join(method_options(method))})")


@ALL
def test_settings_carried_from_elsewhere_are_taken_where_the_method_has_them(name: str) -> None:
    """A long document read streamed keeps the method's options, the chat's settings screen shows a
    kernel for every method, the server's --heads is for the methods that have heads."""
    method = method_carrying(name, {"kernel": 5, "pool": "avg", "window": 8}, budget=BUDGET)
    assert (method.budget, method.window, getattr(method, "kernel", 5), getattr(method, "pool", "avg")) == (BUDGET, 8, 5, "avg")


@ALL
def test_it_refuses_a_budget_below_window_and_sinks(name: str) -> None:
    with pytest.raises(SettingsError, match="budget 19 is smaller than window 16"):
        method_named(name, budget=19, window=WINDOW)


@ALL
@pytest.mark.parametrize("window", [WINDOW, 1])
def test_a_plan_keeps_the_budget_sinks_window_and_pins(name: str, window: int) -> None:
    method = method_named(name, budget=BUDGET, window=WINDOW)
    pins = np.zeros(N_TOKENS, dtype=bool)
    pins[300:310] = True
    plan = method.plan(N_TOKENS, window, votes_for(N_TOKENS), extra_pins=pins)
    kept = plan.kept
    assert np.all(np.diff(kept) > 0) and kept[0] >= 0 and kept[-1] < N_TOKENS  # sorted, unique, in range
    assert set(range(method.sinks)) <= set(kept.tolist())
    assert set(range(300, 310)) <= set(kept.tolist())
    if not method.prunes:
        assert len(kept) == N_TOKENS
        return
    assert len(kept) == BUDGET + 10  # earlier turns are pinned on top of the budget
    assert N_TOKENS - 1 in kept  # the newest token: in the window, or the most recent
    if method.scores:
        assert set(range(N_TOKENS - window, N_TOKENS)) <= set(kept.tolist())


@ALL
def test_a_prompt_within_the_budget_is_kept_whole(name: str) -> None:
    method = method_named(name, budget=BUDGET, window=WINDOW)
    assert method.plan(BUDGET, WINDOW, votes_for(BUDGET)).kept.tolist() == list(range(BUDGET))


@ALL
def test_a_conversation_reports_the_method_that_ran(name: str, tiny_model) -> None:
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(60))
    settings = AskSettings(method=method_named(name, budget=BUDGET, window=WINDOW), max_tokens=4, threads=2,
                           stream=StreamSettings(chunk=128, recent=16))
    conversation = Conversation(tiny_model, "tiny", Document(Path("boxes.txt"), "text", text), settings)
    try:
        events = list(conversation.open(question="What is the code for box 3?"))
        events += list(route.answer(conversation, "What is the code for box 3?"))
    finally:
        conversation.close()
    done = events[-1]
    assert isinstance(done, Done)
    assert done.stats.method == name and done.stats.budget == BUDGET
    prompt = len(conversation.prompt_tokens)
    assert done.stats.prompt_tokens == prompt > 4 * BUDGET
    if not settings.method.prunes:
        assert done.stats.kept_tokens == prompt and not any(isinstance(e, Pruned) for e in events)
    elif settings.method.scores:  # pruned to the budget once the question has observed
        assert done.stats.kept_tokens == BUDGET
    else:  # read within the budget; the question is appended after the last eviction
        assert BUDGET < done.stats.kept_tokens <= BUDGET + prompt - len(conversation.document_tokens)
