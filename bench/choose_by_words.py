"""Whether the question's words (BM25 over the document's passages) tell which reading answers a
later question better, the passage bank or the whole reading: for each question of a passage-bank
record (bench/passage_bank.py) that both ways answered, its passages' best BM25 score, the second,
and the best over the fifth, beside each way's score; a rule "whole where the words point weakly"
would show as the questions where they differ lying at one end.

Usage: python bench/choose_by_words.py RECORD.jsonl [--cuad-data FOLDER] [--max-document-tokens 16000]
       [--model default]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from kvchat.bench.compare import case_document, for_case
from kvchat.bench.cuad import cuad_cases
from kvchat.engine import AskSettings, Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--cuad-data", type=Path)
    parser.add_argument("--max-document-tokens", type=int, default=16000)
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for line in args.record.read_text().splitlines():
        row = json.loads(line)
        if row.get("way") in ("bank", "whole"):
            scores[row["id"]][row["way"]] = row["score"]
    with Engine(args.model, draft=None, use_cache=False) as engine:
        cases = cuad_cases(engine.model.count_tokens, args.max_document_tokens, folder=args.cuad_data)
        for contract in dict.fromkeys(case.meta["contract"] for case in cases):
            asked = [case for case in cases if case.meta["contract"] == contract and len(scores[case.meta["id"]]) == 2]
            if not asked:
                continue
            conversation = engine.conversation(case_document(asked[0]), for_case(AskSettings(), asked[0]))
            try:
                for case in asked:
                    words = np.sort(conversation.passages.bm25(case.question))[::-1]
                    got = scores[case.meta["id"]]
                    print(json.dumps({"id": case.meta["id"], "bank": got["bank"], "whole": got["whole"], "differ": got["bank"] != got["whole"],
                                      "top": round(float(words[0]), 2), "second": round(float(words[1]), 2),
                                      "top_over_fifth": round(float(words[0] / max(words[4], 1e-9)), 2)}), flush=True)
            finally:
                conversation.close()


if __name__ == "__main__":
    main()
