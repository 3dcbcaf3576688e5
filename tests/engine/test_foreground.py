"""A background reading pauses while a question is answered in any kvchat process (foreground.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from kvchat.engine.kvcache.foreground import Foreground


def _give_way_in_thread(foreground: Foreground, cancel: threading.Event) -> tuple[threading.Event, list[bool]]:
    returned, waited = threading.Event(), []

    def run() -> None:
        waited.append(foreground.give_way(cancel))
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    return returned, waited


def test_a_reading_goes_on_at_once_while_no_question_is_answered(tmp_path: Path) -> None:
    assert Foreground(tmp_path / "reading").give_way(threading.Event()) is False


def test_a_reading_waits_until_every_question_is_answered(tmp_path: Path) -> None:
    foreground = Foreground(tmp_path)
    with foreground.answering(), foreground.answering():  # two questions at once share the lock
        returned, waited = _give_way_in_thread(foreground, threading.Event())
        assert not returned.wait(0.5)  # paused while they are answered
    assert returned.wait(10) and waited == [True]


def test_a_paused_reading_that_is_stopped_stops_waiting(tmp_path: Path) -> None:
    foreground, cancel = Foreground(tmp_path), threading.Event()
    with foreground.answering():
        returned, waited = _give_way_in_thread(foreground, cancel)
        assert not returned.wait(0.3)
        cancel.set()
        assert returned.wait(10) and waited == [True]
