"""Whether one long reading holds up everyone else on `kvchat serve`: while a streamed request
about a long document is being read, how long a plain short question waits for its answer, and
how long the long request's client waits for its headers.

    python bench/serve_fairness.py DOCUMENT --readings 1,2 --give-up 120

For each --max-readings value a server of the model starts, DOCUMENT is uploaded, a streamed
question about it is sent, and once its reading has begun (its first progress line) a question
without a document is asked; the long request is then left. With one reading at a time the short
question waits for the whole reading (it is given up after --give-up seconds); with two it is read
between two chunks of the long one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from server_harness import running_server  # noqa: E402

from kvchat.models import resolve_model  # noqa: E402

MODEL = "kvchat-test"


def _short_question(url: str, give_up_s: float) -> float | None:
    """Seconds until a short question without a document was answered, or None after `give_up_s`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
    started = time.perf_counter()
    try:
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=give_up_s).raise_for_status()
    except httpx.TimeoutException:
        return None
    return time.perf_counter() - started


def fairness(model: str, document: Path, readings: int, give_up_s: float) -> None:
    with running_server(resolve_model(model), use_cache=False, sequences=4, max_readings=readings) as (url, _service):
        uploaded = httpx.post(f"{url}/v1/documents", files={"file": (document.name, document.read_bytes())}, timeout=600).json()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the termination clause?"}],
                "stream": True, "document_id": uploaded["id"], "max_tokens": 16}
        sent = time.perf_counter()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as response:
            headers_s = time.perf_counter() - sent
            lines = response.iter_lines()
            next(line for line in lines if line.startswith(": progress "))
            reading_s = time.perf_counter() - sent
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                waited = pool.submit(_short_question, url, give_up_s).result()
    short = f"{waited:.1f} s" if waited is not None else f"> {give_up_s:.0f} s (given up)"
    print(f"max-readings {readings}: {uploaded['tokens']:,}-token document; headers after {headers_s:.2f} s, "
          f"first chunk read after {reading_s:.1f} s; a short question during the reading answered in {short}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("document", type=Path)
    parser.add_argument("--model", default="default")
    parser.add_argument("--readings", default="1,2", help="--max-readings values to compare")
    parser.add_argument("--give-up", type=float, default=120.0, help="seconds after which the short question is given up")
    args = parser.parse_args()
    for readings in (int(value) for value in args.readings.split(",")):
        fairness(args.model, args.document, readings, args.give_up)


if __name__ == "__main__":
    main()
