"""How often an answer's sources hold the clause CUAD's experts marked for it, and what finding
them costs; attribution from the answer's attention (what kvchat does) against attribution from
the question's observation window alone.

Usage: python bench/sources.py [--questions todos,corio,energous] [--model default]
    [--budgets 1024,256] [--max-tokens 48] [--json out.json]

Every cuad question about the named contracts (`kvchat bench --tasks cuad` questions; a contract
longer than the model's context is cut as that task cuts it) is answered with the full cache and
with snapkv at each budget, each from the one reading of its contract. Over the answers that are
right (scored as the cuad task scores them), it reports the share whose first source overlaps the
experts' clause (the question's `evidence`) and the share where one of the three does, for the
answer's attention over the upper half of the layers (what kvchat does), over all of them and
over the lower half, and for the question's window; and the time finding the sources took, against the answer's own decoding.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvchat.bench.answers import answer_matches
from kvchat.bench.cuad import OMISSION, contract_text, cuad_ids_named, cuad_questions, cut_to_tokens
from kvchat.bench.runner import PROMPT_ROOM
from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation, Engine
from kvchat.engine.kvcache.cache import KvCache
from kvchat.events import Done, Pruned, Source
from kvchat.policy import Full, SnapKV

ATTRIBUTIONS = ("answer", "answer, all layers", "answer, lower half", "question")


def _overlaps(sources: tuple[Source, ...], evidence: tuple[int, int]) -> list[bool]:
    return [source.start < evidence[1] and evidence[0] < source.end for source in sources]


class _SelectionVotes:
    """The votes of the last observation window (the question's, in select()), kept as the
    cache's positions and the summed attention each drew: what the question alone points at."""

    def __init__(self) -> None:
        self.last: tuple[np.ndarray, np.ndarray] | None = None
        self._observe = KvCache.observe

    def __enter__(self) -> _SelectionVotes:
        recorder = self

        def observe(cache: KvCache, window: list[int], keep: bool = True) -> np.ndarray:
            before = cache.positions.copy()
            votes = recorder._observe(cache, window, keep)
            recorder.last = before, votes[..., : len(before)].sum(axis=(0, 1), dtype=np.float64)
            return votes

        KvCache.observe = observe  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        KvCache.observe = self._observe  # type: ignore[method-assign]


def _attribute(conversation: Conversation, done: Done, kept: np.ndarray | None, window: int,
               selection: tuple[np.ndarray, np.ndarray] | None) -> dict[str, tuple[tuple[Source, ...], float]]:
    """The attributions of the answer just given, with the seconds each took: from the answer's
    attention (as kvchat sums it, over all layers, and over the lower half), and the question's:
    the votes its window cast when the selection pruned (over the kept cells), else (nothing was
    pruned) those of the window read once more."""
    cache, n_cells, finder = conversation.run.cache, done.stats.kept_tokens, conversation.source_finder
    started = time.perf_counter()
    attention = cache.answer_attention(n_cells)
    by_answer = finder.sources(*attention) if attention is not None else ()
    answer_s = time.perf_counter() - started
    found = {"answer": (by_answer, answer_s)}
    if attention is not None:  # the same attention from half the layers (read once more: not timed)
        votes = cache.reobserve(n_cells, min(cache.cells - n_cells, cache.ctx.settings.n_batch))
        half = votes.shape[0] // 2
        for name, layers in (("answer, all layers", votes), ("answer, lower half", votes[:half])):
            found[name] = (finder.sources(attention[0], layers.sum(axis=(0, 1), dtype=np.float64)), 0.0)
    started = time.perf_counter()
    if kept is not None and selection is not None:
        positions, scores = selection
        on_kept = np.isin(positions, kept)
        by_question = finder.sources(positions[on_kept], scores[on_kept])
    else:
        first = n_cells - min(window, n_cells - 1)
        votes = cache.reobserve(first, n_cells - first)  # the question's window, then the answer again
        by_question = finder.sources(cache.positions[:first].copy(), votes.sum(axis=(0, 1), dtype=np.float64))
    return {**found, "question": (by_question, time.perf_counter() - started)}


def run_contract(engine: Engine, contract: str, ids: set[str], methods: dict[str, AskSettings]) -> list[dict[str, object]]:
    max_tokens = engine.model.shape.n_ctx_train - PROMPT_ROOM
    text = cut_to_tokens(contract_text(contract), lambda t: len(engine.model.tokenize(t)), max_tokens)
    document = Document.from_pages(Path(f"{contract}.txt"), "text", [text])
    clauses = {q.id: re.search(r"\s+".join(map(re.escape, q.evidence.split())), document.text) for q in cuad_questions()
             if q.contract == contract and q.id in ids}
    questions = [q for q in cuad_questions() if clauses.get(q.id)]
    conversation = engine.conversation(document, next(iter(methods.values())))
    records = []
    try:
        for _ in conversation.open():
            pass
        for question in questions:
            match = clauses[question.id]
            evidence = (match.start(), match.end())  # the clause, whitespace as the document has it
            for name, settings in methods.items():
                conversation.reset()
                with _SelectionVotes() as selection:
                    events = list(engine.answer(conversation, question.question, settings))
                done = events[-1]
                assert isinstance(done, Done)
                pruned = [e for e in events if isinstance(e, Pruned)]
                kept = np.asarray(pruned[-1].kept_positions) if pruned else None
                record: dict[str, object] = {
                    "id": question.id, "method": name, "answer": done.answer,
                    "right": answer_matches(done.answer, question.answers, question.refuse),
                    "decode_s": round(done.stats.generated_tokens / done.stats.decode_tokens_per_s, 3)
                    if done.stats.decode_tokens_per_s else 0.0,  # a one-token answer decodes nothing
                    "cut": OMISSION in text,
                }
                found = _attribute(conversation, done, kept, settings.method.window, selection.last)
                for attribution, (sources, seconds) in found.items():
                    record[attribution] = {"overlaps": _overlaps(sources, evidence), "seconds": round(seconds, 3),
                                           "sources": [f"{s.where}: {s.text[:80]}" for s in sources]}
                print(json.dumps(record), flush=True)
                records.append(record)
    finally:
        conversation.close()
    return records


def summary(records: list[dict[str, object]]) -> list[str]:
    lines = []
    for method in dict.fromkeys(str(r["method"]) for r in records):
        rows = [r for r in records if r["method"] == method]
        right = [r for r in rows if r["right"]]
        decode_s = sum(float(r["decode_s"]) for r in rows)
        for attribution in ATTRIBUTIONS:
            first = sum(bool(r[attribution]["overlaps"][:1] == [True]) for r in right if attribution in r)
            any_of = sum(any(r[attribution]["overlaps"]) for r in right if attribution in r)
            cost = sum(float(r[attribution]["seconds"]) for r in rows if attribution in r)
            lines.append(f"{method:12s} {attribution:18s} right {len(right)}/{len(rows)} · first source on the clause "
                         f"{first}/{len(right)} · one of three {any_of}/{len(right)} · finding them {cost:.1f} s "
                         f"({100 * cost / max(decode_s, 1e-9):.0f} % of decoding)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", default="todos,corio,energous", help="cuad question ids or contracts")
    parser.add_argument("--model", default="default", help="registry name or GGUF path")
    parser.add_argument("--budgets", default="1024,256")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, help="write every record and the summary here")
    args = parser.parse_args()
    base = AskSettings(max_tokens=args.max_tokens, sources=False, auto_stream=False)
    methods = {"full": replace(base, method=Full())}
    methods.update({f"snapkv@{b}": replace(base, method=SnapKV(budget=int(b))) for b in args.budgets.split(",")})
    ids = set(cuad_ids_named(tuple(args.questions.split(","))))
    records: list[dict[str, object]] = []
    with Engine(args.model, use_cache=False) as engine:
        for contract in dict.fromkeys(q.contract for q in cuad_questions() if q.id in ids):
            records += run_contract(engine, contract, ids, methods)
    lines = summary(records)
    print("\n".join(lines), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"records": records, "summary": lines}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
