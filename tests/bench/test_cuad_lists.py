"""The cuad-lists task: questions whose answer is every clause of a kind, scored by the clauses
an answer quotes."""

from __future__ import annotations

from kvchat.bench.clauses import clauses_quoted, quotes
from kvchat.bench.lists import list_cases, list_questions
from kvchat.bench.runner import BenchConfig, build_cases
from kvchat.bench.tasks import case_score

CLAUSE = "Todos shall have the right to have an inspection and audit of all the relevant accounting and sales books."


def test_a_clause_is_quoted_by_ten_of_its_words_in_a_row_case_and_punctuation_aside() -> None:
    assert quotes("1. TODOS shall have the right, to have an inspection and (see 4.2).", CLAUSE)
    assert not quotes("Todos shall have the right to conduct periodic on-site inspections.", CLAUSE)  # alike openings
    assert not quotes("Todos may inspect and audit the books.", CLAUSE)  # a paraphrase is not a quote
    assert quotes("It says: the term is two years.", "Two years.")  # a short clause: all of its words
    assert quotes("... an escrow account in the state of California a copy of the source code ...",
                  "The Escrow Agent shall require Commerce One to place in an<omitted>escrow account in the state of California a copy of the source")
    assert clauses_quoted(f"{CLAUSE} And nothing else.", (CLAUSE, "Either party may terminate on notice.")) == 0.5
    tail = "Each delivery shall be inspected by the buyer within ten days<omitted>shall then be deemed accepted."
    assert not quotes("Goods not rejected shall then be deemed accepted.", tail)  # a short fragment is no quote of the clause


def test_list_questions_ask_for_every_clause_the_experts_marked() -> None:
    todos = [item for item in list_questions() if item.id.startswith("todos.")]
    assert [item.category for item in todos] == [
        "Renewal Term", "Competitive Restriction Exception", "License Grant", "Audit Rights", "Cap On Liability"]
    assert all(len(item.clauses) >= 2 and item.question.startswith("List and quote every clause") for item in todos)
    cases = build_cases(BenchConfig(tasks=("cuad-lists",), cuad_ids=("todos.law",)), lambda text: len(text) // 4, 30_000)
    assert [case.meta["id"] for case in cases] == [item.id for item in todos]
    audit = next(case for case in cases if case.meta["category"] == "Audit Rights")
    assert case_score(audit, " ".join(audit.answers)) == 1.0 and case_score(audit, "The contract is silent.") == 0.0
    assert audit.max_tokens is not None and audit.scoring == "clauses"


def test_clauses_a_cut_removed_are_not_asked_for() -> None:
    whole = list_cases(lambda text: len(text) // 4, 100_000, ("bww",))
    cut = list_cases(lambda text: len(text) // 4, 4_000, ("bww",))  # the middle of a 24K-word franchise cut out
    assert len(cut) < len(whole) and all(case.meta["cut"] for case in cut)
    for case in cut:
        assert len(case.answers) >= 2 and all(" ".join(clause.split()[:4]) in " ".join(case.document.split())
                                              for clause in case.answers if "<omitted>" not in clause)
