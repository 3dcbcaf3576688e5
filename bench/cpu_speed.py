"""Reading and decoding speed of one model for each CPU weight layout and thread count, alone or
beside a busy neighbour; each configuration in a child process of its own, several runs each.

Usage: python bench/cpu_speed.py [--model default] [--prompt 2048] [--decode 64] [--runs 3]
       [--layouts plain,extra] [--threads 2/2,1/1] [--waits default,passive,spin=10000] [--neighbours none,spin,reader]

--threads takes READ/DECODE pairs (llama.cpp's n_threads_batch / n_threads). A neighbour is
"spin" (a process busy on one core) or "reader" (another llama.cpp process reading a prompt with
2 threads in a loop, as a benchmark or llama-server would, with libgomp's own spin count). --waits sets how OpenMP threads wait at a barrier in
the measured process: OMP_WAIT_POLICY (active, passive), GOMP_SPINCOUNT ("spin=N": spin N times,
then sleep; libgomp's own is spin=300000), or "default" (kvchat's, kvchat/llama/_lib.py). Prints one JSON line per configuration with
the min/median/max of prompt tok/s and decode tok/s, and the weight buffers llama.cpp chose.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

SAMPLE = "kvchat/samples/marketing_reseller_agreement.pdf"


def child(model_name: str, prompt_tokens: int, decode_tokens: int, read_threads: int, decode_threads: int) -> dict:
    """One measurement in this process: read the prompt in 512-token batches, then decode greedily."""
    from kvchat.documents import load_document
    from kvchat.engine import Engine, time_read_and_decode

    with Engine(model_name, use_cache=False) as engine:
        model = engine.model
        tokens = model.tokenize(load_document(SAMPLE).text * 4)[:prompt_tokens]
        read_s, decode_s = time_read_and_decode(model, tokens, decode_tokens, decode_threads, read_threads)
        return {"read_tok_s": len(tokens) / read_s, "decode_tok_s": decode_tokens / decode_s,
                "weights": model.weight_buffers}


def _neighbour(kind: str, model_name: str) -> subprocess.Popen | None:
    if kind == "none":
        return None
    if kind == "spin":
        command = [sys.executable, "-c", "while True: pass"]
    else:
        command = [sys.executable, "bench/cpu_speed.py", "--child", "--forever", "--model", model_name,
                   "--prompt", "1024", "--decode", "16", "--threads", "2/2"]
    # libgomp's own spin count (300,000), as any llama.cpp process other than kvchat has it
    env = dict(os.environ, GOMP_SPINCOUNT="300000")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8 if kind == "reader" else 1)  # the reader loads its model before it competes
    return process


def run(args: argparse.Namespace, layout: str, threads: str, wait: str, neighbour: str) -> dict:
    read_threads, decode_threads = threads.split("/")
    env = dict(os.environ, KVCHAT_CPU_WEIGHTS=layout)
    if wait.startswith("spin="):
        env["GOMP_SPINCOUNT"] = wait.removeprefix("spin=")
    elif wait != "default":
        env["OMP_WAIT_POLICY"] = wait
    command = [sys.executable, "bench/cpu_speed.py", "--child", "--model", args.model, "--prompt", str(args.prompt),
               "--decode", str(args.decode), "--threads", threads]
    other = _neighbour(neighbour, args.model)
    try:
        runs = [json.loads(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout)
                for _ in range(args.runs)]
    finally:
        if other is not None:
            other.kill()
            other.wait()
    summary: dict[str, object] = {"layout": layout, "read_threads": int(read_threads),
                                  "decode_threads": int(decode_threads), "wait": wait, "neighbour": neighbour,
                                  "weights_mib": runs[0]["weights"]}
    for key in ("read_tok_s", "decode_tok_s"):
        values = sorted(run[key] for run in runs)
        summary[key] = [round(values[0], 1), round(statistics.median(values), 1), round(values[-1], 1)]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layouts", default="plain,extra")
    parser.add_argument("--threads", default="2/2")
    parser.add_argument("--waits", default="default")
    parser.add_argument("--neighbours", default="none")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)  # a "reader" neighbour
    args = parser.parse_args()
    if args.child:
        read_threads, decode_threads = (int(n) for n in args.threads.split("/"))
        while True:
            print(json.dumps(child(args.model, args.prompt, args.decode, read_threads, decode_threads)), flush=True)
            if not args.forever:
                return
    for neighbour, layout, threads, wait in itertools.product(
        args.neighbours.split(","), args.layouts.split(","), args.threads.split(","), args.waits.split(",")
    ):
        print(json.dumps(run(args, layout, threads, wait, neighbour)), flush=True)


if __name__ == "__main__":
    main()
