"""The benchmark: task generators, scoring, the JSON schema, and a small run."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from dataclasses import replace
from importlib import resources

import pytest

from kvchat.bench.answers import answer_matches, mentions
from kvchat.bench.cuad import OMISSION, contract_text, cuad_cases, cuad_contracts, cuad_ids_named, cuad_questions
from kvchat.bench.report import SCHEMA, summarize
from kvchat.bench.runner import QUICK, QUICK_CUAD, BenchConfig, build_cases, run_bench
from kvchat.bench.tasks import (
    Case,
    case_score,
    multi_turn_case,
    multikey_case,
    needle_case,
    score,
    variable_tracking_case,
)
from kvchat.errors import SettingsError

RECORD_KEYS = {
    "model", "read_s", "task", "meta", "method", "variant", "budget", "accuracy", "answer", "golds", "prompt_tokens", "kept_tokens",
    "compression", "kv_bytes_full", "kv_bytes_kept", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s",
    "snapkv_overhead", "peak_cells", "peak_rss_mib", "compact_s", "read", "reading", "kept_histogram",
}


@pytest.fixture(scope="module")
def count_tokens(tiny_model):
    return lambda text: len(tiny_model.tokenize(text))


@pytest.mark.parametrize("length", [1000, 3000])
def test_needle_length_and_single_answer(count_tokens, length: int) -> None:
    for depth in (0.1, 0.5, 0.9):
        case = needle_case(count_tokens, length, depth, seed=3)
        assert case.document.count(case.answers[0]) == 1
        assert 0.9 * length <= count_tokens(case.document) <= length
        offset = case.document.index(case.answers[0]) / len(case.document)
        assert abs(offset - depth) < 0.1


def test_multikey_and_vt_answers_appear_once(count_tokens) -> None:
    case = multikey_case(count_tokens, 3000, 8, seed=4)
    assert case.document.count(case.answers[0]) == 1
    assert case.document.count("special magic number") == 8 and case.task == "multikey"
    sixteen = multikey_case(count_tokens, 3000, 16, seed=4)
    assert sixteen.document.count("special magic number") == 16 and sixteen.task == "multikey16"
    vt = variable_tracking_case(count_tokens, 3000, seed=4)
    value = vt.question.split("value ")[1].split(",")[0]
    assert vt.document.count(value) == 1 and len(vt.answers) == 5
    assert all(vt.document.count(f"VAR {name} =") == 1 for name in vt.answers)


def test_seeds_reproduce(count_tokens) -> None:
    assert needle_case(count_tokens, 1000, 0.5, 7) == needle_case(count_tokens, 1000, 0.5, 7)
    assert needle_case(count_tokens, 1000, 0.5, 7).answers != needle_case(count_tokens, 1000, 0.5, 8).answers
    assert multi_turn_case(count_tokens, 2000, (0.1, 0.9), 2) == multi_turn_case(count_tokens, 2000, (0.1, 0.9), 2)


def test_samples_make_each_case_again_from_seeds_of_their_own(count_tokens) -> None:
    config = BenchConfig(tasks=("needle", "multikey", "vt"), lengths=(1000,), depths=(0.2, 0.8), seed=5)
    one, three = build_cases(config, count_tokens, 30_000), build_cases(replace(config, samples=3), count_tokens, 30_000)
    assert [case.task for case in three] == ["needle", "needle", "multikey", "vt"] * 3
    assert three[:4] == one  # the first sample is the run without samples
    assert [case.meta["seed"] for case in three] == [5, 6, 5, 5, 7, 8, 7, 7, 9, 10, 9, 9]
    assert len({case.answers for case in three if case.task == "vt"}) == 3


QUESTIONS_PER_CONTRACT = {  # shortest contract first
    "cuad_todos_medical_marketing_reseller": 9, "cuad_corio_license_hosting": 9, "cuad_energous_strategic_alliance": 7,
    "cuad_buffalo_wild_wings_franchise": 6, "cuad_mrs_fields_franchise": 7,
    "cuad_array_biopharma_license_development": 4, "cuad_manufacturers_services_outsourcing": 7,
}


def count_words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize(("answer", "golds"), [
    ("Sixty (60) days", ("60 days",)),
    ("60 days", ("sixty (60) days",)),
    ("at least one hundred eighty (180) days' notice", ("180 days",)),
    ("the twelve-month period before the claim", ("12 months",)),
    ("Five thousand dollars.", ("$5,000",)),
    ("$5,000.00", ("five thousand dollars",)),
    ("3%", ("three percent",)),
    ("28 March 2019", ("March 28, 2019",)),
    ("2019-03-28", ("March 28, 2019",)),
    ("3/28/2019", ("March 28, 2019",)),
    ("3/28/19", ("28th March 2019",)),
    ("March 28, 2019", ("2019-03-28",)),
    ("the 20t h day of December 2018", ("December 20, 2018",)),
    ("Care G.B. Plus", ("Care G. B. Plus Ltd.",)),
    ("CARE G. B. PLUS LTD", ("Care G. B. Plus Ltd.",)),
    ("BW3 Franchise Systems", ("bw-3 Franchise Systems, Inc.",)),
    ("The laws of the State of Israel.", ("Israel",)),
    ("one or more annual periods", ("1 year", "annual")),
    ("Ono", ("Ono Pharmaceutical Co., Ltd.", "Ono")),
])
def test_answer_match_accepts(answer: str, golds: tuple[str, ...]) -> None:
    assert answer_matches(answer, golds)


@pytest.mark.parametrize(("answer", "golds", "refuse"), [
    ("30 days", ("60 days",), ()),
    ("600 days", ("60 days",), ()),
    ("60 months", ("60 days",), ()),
    ("30, 60 or 180 days", ("60 days",), ()),
    ("two (2) years, then five (5) years", ("2 years",), ()),
    ("March 28, 2018", ("March 28, 2019",), ()),
    ("December 20, 2018 or 3/28/2019", ("December 20, 2018",), ()),
    ("Care", ("Care G. B. Plus Ltd.",), ()),
    ("Care G. B. Plus Ltd. and Todos Medical Ltd.", ("Care G. B. Plus Ltd.",), ("Todos Medical",)),
    ("none of them", ("Ono",), ()),
    ("", ("Israel",), ()),
])
def test_answer_match_refuses(answer: str, golds: tuple[str, ...], refuse: tuple[str, ...]) -> None:
    assert not answer_matches(answer, golds, refuse)


def test_case_score_follows_the_cases_scoring() -> None:
    normalized = Case("cuad", "", "q", ("60 days", "2 months"), scoring="normalized", refuse=("Todos",))
    assert case_score(normalized, "sixty (60) days") == 1.0
    assert case_score(normalized, "60 days, says Todos") == 0.0
    assert case_score(Case("vt", "", "q", ("AAAAA", "BBBBB")), "AAAAA") == 0.5


def test_cuad_questions_ship_with_their_contracts() -> None:
    questions = cuad_questions()
    counts = {contract: sum(q.contract == contract for q in questions) for contract in cuad_contracts()}
    assert list(counts.items()) == list(QUESTIONS_PER_CONTRACT.items())
    assert len({q.id for q in questions}) == len(questions) == 49
    shipped = {entry.name for entry in (resources.files("kvchat.bench") / "data" / "cuad").iterdir()}
    assert shipped == {f"{c}.txt" for c in QUESTIONS_PER_CONTRACT} | {"questions.json", "lists.json", "SOURCE.md"}
    assert "CC BY 4.0" in (resources.files("kvchat.bench") / "data" / "cuad" / "SOURCE.md").read_text()


def test_every_cuad_gold_is_stated_by_its_clause() -> None:
    for question in cuad_questions():
        assert question.evidence in contract_text(question.contract), question.id
        assert mentions(question.evidence, question.answers[0]), question.id
        assert not question.question.startswith("Highlight"), question.id
        assert not any(mentions(question.question, wrong) for wrong in question.refuse), question.id  # echoes pass


def test_cuad_cases_read_whole_contracts_when_they_fit() -> None:
    cases = cuad_cases(count_words, 10**9)
    assert len(cases) == 49
    assert all(case.document == contract_text(case.meta["contract"]) and not case.meta["cut"] for case in cases)
    assert {case.scoring for case in cases} == {"normalized"}


def test_cuad_cuts_long_contracts_in_the_middle_and_drops_what_the_cut_removed() -> None:
    cases = cuad_cases(count_words, 12_000)
    documents = {case.meta["contract"]: case.document for case in cases}
    for contract, document in documents.items():
        full = contract_text(contract)
        assert count_words(document) <= 12_000
        assert (OMISSION in document) == (count_words(full) > 12_000) == (document != full)
        assert document.startswith(full[:200]) and document.endswith(full[-200:])
    asked = {case.meta["id"] for case in cases}
    assert {q.id for q in cuad_questions()} - asked == {"mrsfields.successor", "mrsfields.notice", "mrsfields.cap",
                                                        "msl.cap", "msl.law"}


def test_quick_cuad_asks_five_questions_about_the_shortest_contract() -> None:
    cases = build_cases(replace(QUICK, tasks=("cuad",)), count_words, 30_000)
    assert [case.meta["id"] for case in cases] == list(QUICK_CUAD) and len(cases) == 5
    assert {case.meta["contract"] for case in cases} == {"cuad_todos_medical_marketing_reseller"}
    assert [case.meta["id"] for case in cuad_cases(count_words, 30_000, ("corio.law", "todos.law"))] == [
        "todos.law", "corio.law"]
    with pytest.raises(ValueError, match="todos.colour"):
        cuad_cases(count_words, 30_000, ("todos.colour",))


def test_cuad_questions_are_named_by_id_or_contract() -> None:
    todos = [q.id for q in cuad_questions() if q.contract == "cuad_todos_medical_marketing_reseller"]
    assert cuad_ids_named(("corio.law", "todos")) == (*todos, "corio.law")  # in the task's order
    assert len(todos) == 9
    with pytest.raises(SettingsError, match=r"unknown cuad question\(s\) \['todo'\]"):
        cuad_ids_named(("todo",))  # a prefix of a name is no name


def test_cuad_questions_and_contracts_can_come_from_another_folder(tmp_path) -> None:
    """Held-out questions or one's own contracts: a folder laid out like the shipped one."""
    (tmp_path / "lease.txt").write_text("LEASE. The rent is one thousand dollars. " + "Filler words. " * 50)
    (tmp_path / "memo.txt").write_text("MEMO. Notice is due within 30 days.")
    questions = [
        {"id": "lease.rent", "contract": "lease", "category": "Rent", "question": "What is the monthly rent?",
         "answers": ["$1,000"], "evidence": "The rent is one thousand dollars.", "cuad_answer": "$1,000"},
        {"id": "memo.notice", "contract": "memo", "category": "Notice", "question": "How much notice?",
         "answers": ["30 days"], "evidence": "Notice is due within 30 days.", "cuad_answer": "30 days"},
    ]
    (tmp_path / "questions.json").write_text(json.dumps({"source": "test", "questions": questions}))
    assert cuad_contracts(tmp_path) == ["memo", "lease"]  # shortest first
    cases = cuad_cases(count_words, 10**6, folder=tmp_path)
    assert [(case.meta["id"], case.answers) for case in cases] == [("memo.notice", ("30 days",)), ("lease.rent", ("$1,000",))]
    assert cuad_ids_named(("lease",), tmp_path) == ("lease.rent",)
    (tmp_path / "memo.txt").unlink()
    contract_text.cache_clear()
    with pytest.raises(SettingsError, match="cannot read contract .*memo.txt"):
        cuad_cases(count_words, 10**6, folder=tmp_path)
    with pytest.raises(SettingsError, match="cannot read cuad questions"):
        cuad_questions(tmp_path / "nowhere")


def test_scoring_is_case_insensitive_substring() -> None:
    assert score("The number is 7007071.", ("7007071",)) == 1.0
    assert score("the state of ISRAEL", ("Israel",)) == 1.0
    assert score("700.", ("7007071",)) == 0.0
    assert score("AAAAA and BBBBB", ("aaaaa", "bbbbb", "ccccc", "ddddd")) == 0.5


def test_records_and_summary_on_the_tiny_model(tiny_model_path) -> None:
    from kvchat.engine import Engine

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=8)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    assert {r["method"] for r in records} == {"full", "snapkv", "streamingllm", "snapstream"}
    for record in records:
        assert set(record) == RECORD_KEYS
        assert record["kept_tokens"] <= record["prompt_tokens"] and record["read"] == record["reading"] == "full"
        if record["method"] in ("snapkv", "full"):  # the full cache is never compacted; snapkv once
            assert (record["compact_s"] > 0) == (record["method"] == "snapkv")
        if record["method"] in ("snapkv", "snapstream"):  # every kept token in one of the prompt's parts
            assert len(record["kept_histogram"]) == 32 and sum(record["kept_histogram"]) == record["kept_tokens"]
    kept = {r["method"]: r["kept_tokens"] for r in records}
    assert kept["snapkv"] == kept["snapstream"] == 128
    assert kept["streamingllm"] < kept["full"] == records[0]["prompt_tokens"]
    summary = {row["variant"]: row for row in summarize(records)}
    assert summary["full"]["decode_speedup"] == 1.0
    assert summary["snapkv@128"]["kv_saving"] > 3


def test_a_fast_reading_is_a_variant_of_its_own_read_per_question(tiny_model_path) -> None:
    from kvchat.engine import Engine

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.25, 0.75), budgets=(128,), decode_tokens=4,
                         methods=("full", "snapkv"), reads=("full", "fast"))
    assert [variant.label for variant in config.variants()] == ["full", "snapkv@128", "snapkv@128 fast"]
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    fast = [r for r in records if r["variant"] == "snapkv@128 fast"]
    assert len(fast) == 2 and all(r["kept_tokens"] == 128 and r["method"] == "snapkv" for r in fast)
    assert {row["variant"] for row in summarize(records)} == {"full", "snapkv@128", "snapkv@128 fast"}


def test_a_variant_sets_a_reading_option_or_a_method_option() -> None:
    from kvchat.bench.runner import Variant
    from kvchat.engine import AskSettings
    from kvchat.engine.settings import AUTO_READING

    variant = Variant("snapkv", 512, (("read", "fast"), ("fast_depth", "0.25"), ("fast_layers", "3"), ("kernel", "5")))
    settings = variant.settings(AskSettings())
    assert (settings.read, settings.fast.depth, settings.fast.layers) == ("fast", 0.25, 3)
    assert settings.method.kernel == 5 and settings.method.budget == 512
    assert variant.label == "snapkv@512(read=fast,fast_depth=0.25,fast_layers=3,kernel=5)"
    assert Variant("snapkv", 512, (("heads", "per-head"),)).settings(AskSettings()).method.per_head
    from kvchat.cli.bench import _overrides

    assert _overrides("flash_attn=on,type_k=q8_0,type_v=q8_0") == (("flash_attn", "on"), ("type_k", "q8_0"), ("type_v", "q8_0"))
    quantized = Variant("snapkv", 512, _overrides("flash_attn=on,type_k=q8_0,type_v=q8_0")).settings(AskSettings())
    assert (quantized.layout.flash_attn, quantized.layout.type_k, quantized.layout.type_v) == (True, "q8_0", "q8_0")
    either_order = Variant("snapkv", 512, _overrides("type_v=q8_0,type_k=q8_0,flash_attn=on")).settings(AskSettings())
    assert either_order.layout == quantized.layout
    by_wording = Variant("snapkv", 512, _overrides("read=fast,whole=auto")).settings(AskSettings(in_parts="off"))
    assert (by_wording.in_parts, by_wording.part_tokens, by_wording.read) == ("auto", AskSettings().part_tokens, "fast")
    assert Variant("snapkv", 512, _overrides("whole=off")).settings(AskSettings()).in_parts == "off"
    assert Variant("snapkv", 512, _overrides("whole=512")).settings(AskSettings()).part_tokens == 512
    as_the_defaults = Variant("snapkv", 512, _overrides("read=fast,fast_choose=bm25,fast_opening=1,fast_opening_for=document"))
    assert as_the_defaults.settings(AskSettings()).fast_reading == AUTO_READING
    for bad, said in (("flash_attn=yes", "bad variant value flash_attn='yes'"), ("whole=abc", "bad variant value whole='abc'"),
                      ("kernel=big", "bad variant value kernel='big'"), ("system=wise", "unknown instruction 'wise'"),
                      ("read=auto,fast_reread=1280", "fast_reread changes nothing with read=auto"),
                      ("fast_opening=1", "fast_opening changes nothing with read=full"),
                      ("read=fast,fast_opening_for=some", "unknown fast reading opening_for 'some'")):
        with pytest.raises(SettingsError, match=re.escape(said)):
            Variant("snapkv", 512, _overrides(bad)).settings(AskSettings())


def test_a_layout_variant_reads_the_document_again_in_its_layout(tiny_model_path) -> None:
    from kvchat.engine import Engine

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=4,
                         methods=("full", "snapkv"), policy_variants=((("flash_attn", "on"),),))  # tiny heads fit no q8_0 block
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        opened = []
        conversation = engine.conversation
        engine.conversation = lambda document, settings, **kw: opened.append(settings.layout) or conversation(document, settings, **kw)
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    assert [layout.flash_attn for layout in opened] == [False, True]  # one document, read once per layout
    flash = [r for r in records if r["variant"] == "snapkv@128(flash_attn=on)"]
    assert len(flash) == 1 and all(r["kept_tokens"] == 128 for r in flash)


def test_the_runs_layout_is_every_variants_unless_one_names_its_own(tiny_model_path) -> None:
    from kvchat.engine import Engine, KvLayout

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=4, methods=("snapkv",),
                         policy_variants=((("flash_attn", "off"),),), layout=KvLayout(flash_attn=True))  # as --flash-attn on
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        opened = []
        conversation = engine.conversation
        engine.conversation = lambda document, settings, **kw: opened.append(settings.layout) or conversation(document, settings, **kw)
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    assert [layout.flash_attn for layout in opened] == [True, False]
    assert [r["variant"] for r in records] == ["snapkv@128", "snapkv@128(flash_attn=off)"]


def test_a_system_prompt_variant_reads_again_with_it_and_wins_over_a_tasks_own(tiny_model_path) -> None:
    from kvchat.bench.compare import for_case
    from kvchat.bench.instructions import INSTRUCTIONS
    from kvchat.engine import AskSettings, Engine
    from kvchat.engine.prompt import SYSTEM_PROMPT

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=4,
                         methods=("snapkv",), policy_variants=((("system", "only"),),))
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        opened = []
        conversation = engine.conversation
        engine.conversation = lambda document, settings, **kw: opened.append(settings.system) or conversation(document, settings, **kw)
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    assert opened == [None, INSTRUCTIONS["only"]] and [r["variant"] for r in records] == ["snapkv@128", "snapkv@128(system=only)"]
    case = replace(needle_case(len, 100, 0.5, seed=1), system="the task's", max_tokens=7)
    assert (for_case(AskSettings(), case).system, for_case(AskSettings(), case).max_tokens) == ("the task's", 7)
    assert for_case(AskSettings(system=INSTRUCTIONS["only"]), case).system == INSTRUCTIONS["only"]
    assert for_case(AskSettings(system=INSTRUCTIONS["kvchat"]), case).system == SYSTEM_PROMPT  # kvchat's own, over the task's


def test_a_whole_document_variant_answers_each_case_from_the_parts(tiny_model_path) -> None:
    from kvchat.engine import Engine

    config = BenchConfig(tasks=("needle",), lengths=(700,), depths=(0.5,), budgets=(128,), decode_tokens=4,
                         methods=("snapkv",), policy_variants=((("whole", "256"),),))
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        records = [record for _, _, record in run_bench(engine, config) if record is not None]
    parts = [r for r in records if r["variant"] == "snapkv@128(whole=256)"]
    assert len(parts) == 1 and parts[0]["read"].startswith("in ") and parts[0]["read"].endswith(" parts")


def _summary_record(model: str, variant: str, case: int, accuracy: float, budget: int = 1024) -> dict:
    return {"model": model, "task": "cuad", "meta": {"id": case}, "method": variant.split("@")[0], "variant": variant,
            "reading": variant.split(" ")[1] if " " in variant else "full", "budget": budget, "accuracy": accuracy,
            "compression": 1.0, "kv_bytes_full": 2, "kv_bytes_kept": 1, "decode_tokens_per_s": 1.0, "ttft_s": 1.0,
            "read_s": 1.0, "snapkv_overhead": 0.0}


def test_summary_says_what_pruning_keeps_of_the_full_caches_answers() -> None:
    record = _summary_record
    full = {"a": [1.0, 1.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0]}  # per model, cases 0..3
    snapkv = {"a": [1.0, 0.0, 1.0, 1.0], "b": [1.0, 0.0, 0.0, 0.0]}
    records = [record(model, "full", case, value) for model, values in full.items() for case, value in enumerate(values)]
    records += [record(model, "snapkv@1024", case, value) for model, values in snapkv.items()
                for case, value in enumerate(values)]
    kept = {(row["model"], row["variant"]): row["kept_of_full"] for row in summarize(records)}
    assert kept == {("a", "full"): 1.0, ("a", "snapkv@1024"): round(2 / 3, 3),  # case 2: right, but full was not
                    ("b", "full"): None, ("b", "snapkv@1024"): None}  # full answered none: nothing to keep


def test_a_document_is_read_once_for_all_its_questions(tiny_model_path, count_tokens) -> None:
    """One reading serves every question for the methods that prune after reading, and another
    for StreamingLLM; SnapStream reads once per question (its question observes the reading).
    Every answer starts from the restored reading: the same as from a reading of its own."""
    from kvchat.bench.compare import answer_of, compare
    from kvchat.engine import AskSettings, Engine
    from kvchat.policy import method_named

    first = needle_case(count_tokens, 700, 0.5, seed=1)
    second = replace(first, question="What is the first word of the provided text?")
    variants = [AskSettings(max_tokens=6, method=method_named(name, budget=128))
                for name in ("full", "snapkv", "streamingllm", "snapstream")]
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        opened = []
        conversation = engine.conversation
        engine.conversation = lambda document, settings, **kw: opened.append(settings.method.name) or conversation(
            document, settings, **kw)
        answers = {(c, v): answer_of(events).answer for c, v, events in compare(engine, [first, second], variants)}
        assert sorted(opened) == ["full", "snapstream", "snapstream", "streamingllm"]
        assert sorted(answers) == [(c, v) for c in range(2) for v in range(4)]
        alone = {v: answer_of(events).answer for _, v, events in compare(engine, [second], variants)}
    assert all(answers[1, v] == alone[v] for v in range(4))


@pytest.mark.parametrize(("length", "budget", "readings"), [(150, 256, 1), (1200, 128, 3)])
def test_the_defaults_share_the_whole_reading_where_a_fast_one_does_not_pay(
        tiny_model_path, tmp_path, count_tokens, length: int, budget: int, readings: int) -> None:
    """With a draft the defaults read what the question chooses only where that (the budget) is
    under two thirds of the prompt (fast.pays): 256 of about 350 tokens does not pay, and the
    defaults then read in full, question apart, sharing the whole reading; 128 of 1,200 pays,
    and each question reads its own passages."""
    from kvchat.bench.compare import answer_of, compare
    from kvchat.engine import AskSettings, Engine
    from kvchat.policy import method_named
    from tests.tiny_gguf import write_tiny_gguf

    first = needle_case(count_tokens, length, 0.5, seed=1)
    second = replace(first, question="What is the first word of the provided text?")
    pruned = AskSettings(max_tokens=4, method=method_named("snapkv", budget=budget), read="full")
    variants = [pruned, replace(pruned, read="auto")]
    with Engine(str(tiny_model_path), use_cache=False, draft=str(write_tiny_gguf(tmp_path / "draft.gguf", seed=9))) as engine:
        opened = []
        conversation = engine.conversation
        engine.conversation = lambda document, settings, **kw: opened.append(settings.read) or conversation(document, settings, **kw)
        answers = {(c, v): answer_of(events) for c, v, events in compare(engine, [first, second], variants)}
    assert len(opened) == readings
    reads = {answers[c, 1].stats.read != "full" for c in range(2)}
    assert reads == {readings > 1}
    if readings == 1:  # the same reading, the same selection: the same answer
        assert all(answers[c, 0].answer == answers[c, 1].answer for c in range(2))


def test_summary_sets_every_way_of_answering_against_retrieval_on_the_same_questions() -> None:
    scores = {"snapkv@1024(read=retrieval,fast_opening=1) retrieval": [0.5, 1.0, 0.5, 1.0],  # a variant's: not the baseline
              "snapkv@1024 retrieval": [0.0, 1.0, 0.0, 1.0], "snapkv@1024": [1.0, 1.0, 1.0, 1.0],
              "snapkv@1024 auto": [1.0, 0.0, 0.0, 1.0]}
    records = [_summary_record("m", variant, case, value) for variant, values in scores.items() for case, value in enumerate(values)]
    records += [_summary_record("m", "snapkv@512", case, 1.0, budget=512) for case in range(4)]  # no retrieval at 512
    records.append(_summary_record("m", "full", 4, 1.0))  # a case retrieval did not answer
    against = {row["variant"]: row["against_retrieval"] for row in summarize(records)}
    assert against["snapkv@1024 retrieval"] is None and against["snapkv@512"] is None  # the baseline; none at its budget
    assert against["full"] is None  # its one case is not retrieval's
    assert against["snapkv@1024"] == {"cases": 4, "difference": 0.5, "interval": [0.0, 1.0]}
    assert against["snapkv@1024(read=retrieval,fast_opening=1) retrieval"] == {"cases": 4, "difference": 0.25, "interval": [0.0, 0.5]}
    auto = against["snapkv@1024 auto"]  # differences 1, -1, 0, 0
    assert auto["cases"] == 4 and auto["difference"] == 0.0 and -1.0 < auto["interval"][0] < 0.0 < auto["interval"][1] < 1.0


@pytest.mark.system
def test_bench_command_compares_two_models_and_writes_json_and_plots(tiny_model_path, tmp_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_model_path.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "bench", "--quick", "--model", str(tiny_model_path), "--model", str(other),
         "--lengths", "600", "--budget", "96", "--read", "full,retrieval", "--json", str(tmp_path / "out.json"),
         "--plot", str(tmp_path / "plots")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["schema"] == SCHEMA and document["models"] == [str(tiny_model_path), str(other)] and document["complete"]
    rows = {(row["model"], row["method"]) for row in document["summary"]}
    methods = {"full", "snapkv", "streamingllm", "snapstream"}
    assert rows == {(model, method) for model in document["models"] for method in methods}
    assert all(row["decode_tokens_per_s"] > 0 and row["read_s"] > 0 for row in document["summary"])
    for folder in (tiny_model_path.stem, "other"):
        for name in ("needle_heatmap.png", "accuracy_vs_budget.png", "decode_speed_vs_length.png"):
            assert (tmp_path / "plots" / folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = result.stdout
    assert "snapkv@96" in table and "read s" in table and "of full" in table and table.count("other.gguf") == 5
    against = {(row["model"], row["variant"]): row["against_retrieval"] for row in document["summary"]}
    assert all(against[model, "snapkv@96 retrieval"] is None and against[model, "full"]["cases"] == 2 for model in document["models"])  # needle, multikey
    assert "vs retrieval" in table
    assert document["config"]["gpu_layers"] == 0 and document["config"]["layout"]["flash_attn"] is False  # auto, on the CPU


@pytest.mark.system
def test_bench_refuses_a_missing_model_before_running_the_first(tiny_model_path, tmp_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run(
        [sys.executable, "-m", "kvchat.cli", "bench", "--quick", "--model", str(tiny_model_path),
         "--model", str(tmp_path / "missing.gguf"), "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 1 and "missing.gguf" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.json").exists()


@pytest.mark.real_model
def test_quick_sized_run_on_the_small_model(real_engine) -> None:
    config = BenchConfig(tasks=("needle",), lengths=(1200,), depths=(0.5,), budgets=(256,), decode_tokens=16)
    records = {r["method"]: r for _, _, r in run_bench(real_engine, config) if r is not None}
    assert records["full"]["accuracy"] == 1.0
    assert records["snapkv"]["accuracy"] == 1.0 and records["snapkv"]["kept_tokens"] == 256
    assert records["snapstream"]["kept_tokens"] <= 256


@pytest.mark.system
@pytest.mark.parametrize("extra", [["--budget", "10"], ["--variant", "pool=median"], ["--tasks", "poetry"],
                                   ["--tasks", "cuad", "--questions", "todos,bogus"], ["--tasks", "cuad", "--cuad-data", "/nowhere"]])
def test_bench_refuses_bad_settings_with_one_line(extra, tiny_model_path, isolated_home) -> None:
    env = {**os.environ, "KVCHAT_HOME": str(isolated_home)}
    result = subprocess.run([sys.executable, "-m", "kvchat.cli", "bench", "--quick", "--model", str(tiny_model_path),
                             *extra], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvchat: error:")


def test_reading_fast_alone_leaves_out_the_full_readings() -> None:
    config = BenchConfig(methods=("full", "snapkv", "streamingllm"), reads=("fast",),
                         policy_variants=((("read", "fast"), ("fast_spans", "chunks")), (("kernel", "5"),)))
    assert [variant.label for variant in config.variants()] == ["snapkv@1024(read=fast,fast_spans=chunks)", "snapkv@1024 fast"]
    both = replace(config, reads=("full", "fast"))
    assert [variant.label for variant in both.variants()] == [
        "full", "snapkv@1024", "streamingllm@1024", "snapkv@1024(read=fast,fast_spans=chunks)", "snapkv@1024(kernel=5)",
        "snapkv@1024 fast"]
