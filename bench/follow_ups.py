"""Follow-ups asked while the document is still read whole, timed as the chat meets them.

Usage: python bench/follow_ups.py DOCUMENT QUESTION QUESTION [QUESTION] [--model default] [--draft small]
       [--budget 1024] [--wait S] [--read auto|retrieval|fast]

The first question is answered from a fast reading of its own; the document's whole reading then
goes on in a background thread, as `kvchat chat` runs it; after `--wait` seconds (the user reading
the answer) it is stopped, and the second question is asked, the first as its earlier turn. After
that, if a third question is given, the reading goes on to its end (timed) and it is selected from it.
A follow-up that waited for the rest of the reading would have come after that rest and a
selection from it: compare the second question's time to first token with the reading's and the
third's. One JSON line per question, then one for the reading; the second question's has how
long the background reading took to stop (`reading_stopped_after_s`), which the chat's question
waits before its own reading. Use a KVCHAT_HOME where the
document's reading is not saved yet (else every question loads it).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from kvchat.documents import load_document
from kvchat.engine import AskSettings, Conversation, Engine
from kvchat.errors import CancelledError
from kvchat.events import Done, Progress
from kvchat.policy import SnapKV


def _asked(engine: Engine, conversation: Conversation, question: str) -> dict[str, object]:
    started = time.perf_counter()
    done = [event for event in engine.answer(conversation, question) if isinstance(event, Done)][0]
    return {"question": question, "read": done.stats.read, "ttft_s": round(done.stats.ttft_s, 2),
            "prompt_tokens": done.stats.prompt_tokens, "kept_tokens": done.stats.kept_tokens,
            "answer": done.answer.strip(), "total_s": round(time.perf_counter() - started, 2)}


def _read_on(conversation: Conversation, stop: threading.Event, progress: list[int]) -> None:
    """The chat's background reading: Conversation.read_on until done or stopped."""
    try:
        for event in conversation.read_on(stop):
            if isinstance(event, Progress):
                progress.append(event.done)
    except CancelledError:  # stopped for the follow-up: it goes on from there later
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("questions", nargs="+")
    parser.add_argument("--model", default="default")
    parser.add_argument("--draft", default="small")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--wait", type=float, default=20.0, help="seconds of background reading before the follow-up")
    parser.add_argument("--read", default="auto", help="how the questions before the whole reading read (kvchat ask --read)")
    args = parser.parse_args()
    settings = AskSettings(method=SnapKV(budget=args.budget), read=args.read)
    with Engine(args.model, draft=args.draft) as engine:  # its speeds and saved readings: KVCHAT_HOME's
        conversation = engine.conversation(load_document(args.document), settings)
        try:
            list(conversation.open())
            print(json.dumps(_asked(engine, conversation, args.questions[0])), flush=True)
            stop, progress = threading.Event(), []
            reader = threading.Thread(target=_read_on, args=(conversation, stop, progress))
            reader.start()
            time.sleep(args.wait)
            stopping = time.perf_counter()
            stop.set()
            reader.join()  # the chat's question waits for this too, before its own reading
            stopped_s = round(time.perf_counter() - stopping, 2)
            read_before = progress[-1] if progress else 0
            print(json.dumps({**_asked(engine, conversation, args.questions[1]), "whole_read_before": read_before,
                              "reading_stopped_after_s": stopped_s}), flush=True)
            rest_s = None
            if args.questions[2:]:
                started = time.perf_counter()
                _read_on(conversation, threading.Event(), progress)
                rest_s = round(time.perf_counter() - started, 1)
            for question in args.questions[2:]:
                print(json.dumps(_asked(engine, conversation, question)), flush=True)
            print(json.dumps({"document_tokens": len(conversation.document_tokens), "read_before_follow_up": read_before,
                              "rest_of_reading_s": rest_s}), flush=True)
        finally:
            conversation.close()


if __name__ == "__main__":
    main()
