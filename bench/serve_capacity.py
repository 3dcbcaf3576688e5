"""How many conversations about one long document a server holds at once, and how fast it answers
1, 4 and 8 concurrent clients.

    python bench/serve_capacity.py DOCUMENT QUESTIONS_JSON --sessions 14 --room 96 --max-tokens 48
    python bench/serve_capacity.py --throughput

The first form uploads DOCUMENT (read once, or loaded from a saved reading) and asks every
question of QUESTIONS_JSON (a list of strings) at once, each a conversation of its own; it
prints the KV cells each conversation's sequence took (its kept prompt and its answer) against
one full cache of the document. The second asks
plain questions from 1, 4 and 8 clients and prints tokens/s across all of them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from server_harness import running_server  # noqa: E402

from kvchat.models import resolve_model  # noqa: E402

MODEL = "kvchat-test"


def capacity(model: str, document: Path, questions: list[str], sessions: int, room: int, max_tokens: int) -> None:
    with running_server(resolve_model(model), use_cache=True, budget=1024, sequences=sessions, room=room, max_tokens=max_tokens,
                        max_waiting=len(questions)) as (url, service):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
        uploaded = httpx.post(f"{url}/v1/documents", files={"file": (document.name, document.read_bytes())}, timeout=600).json()
        started = time.perf_counter()

        def one(question: str) -> tuple[str, int]:
            """The answer, and the cells its sequence held at most (it is emptied once answered)."""
            completion = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": question}], extra_body={"document_id": uploaded["id"]}
            )
            cells = completion.model_extra["kv"]["kept_tokens"] + completion.usage.completion_tokens
            return completion.choices[0].message.content, cells

        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            answers = list(pool.map(one, questions))
        per_token = service.engine.model.shape.kv_bytes_per_token()
        total_cells = service.limits.sequence_cells * sessions
        print(json.dumps({
            "document_tokens": uploaded["tokens"], "conversations": len(questions), "sequences": sessions,
            "cells_per_sequence": service.limits.sequence_cells, "cells_allocated": total_cells,
            "kv_mib_allocated": round(total_cells * per_token / 2**20, 1),
            "kv_mib_one_full_cache": round(uploaded["tokens"] * per_token / 2**20, 1),
            "cells_per_conversation": [cells for _, cells in answers], "seconds": round(time.perf_counter() - started, 1),
            "answers": [answer for answer, _ in answers],
        }, indent=1))


def throughput(model: str, requests_per_client: int, max_tokens: int) -> None:
    with running_server(resolve_model(model), budget=1024, sequences=8, max_tokens=max_tokens, max_waiting=16) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

        def session(index: int) -> int:
            tokens = 0
            for turn in range(requests_per_client):
                completion = client.chat.completions.create(
                    model=MODEL, max_tokens=max_tokens, temperature=0.7, seed=index * 100 + turn,
                    messages=[{"role": "user", "content": f"Write a long story about lighthouse number {index}-{turn}."}],
                )
                tokens += completion.usage.completion_tokens
            return tokens

        for clients in (1, 4, 8):
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                tokens = sum(pool.map(session, range(clients)))
            elapsed = time.perf_counter() - started
            print(json.dumps({"clients": clients, "requests": clients * requests_per_client, "completion_tokens": tokens,
                              "seconds": round(elapsed, 1), "tokens_per_s": round(tokens / elapsed, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("document", nargs="?", type=Path)
    parser.add_argument("questions", nargs="?", type=Path)
    parser.add_argument("--sessions", type=int, default=14)
    parser.add_argument("--room", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    args = parser.parse_args()
    if args.throughput:
        throughput(args.model, args.requests, args.max_tokens)
    else:
        capacity(args.model, args.document, json.loads(args.questions.read_text()), args.sessions, args.room, args.max_tokens)


if __name__ == "__main__":
    main()
