"""Selection policy on synthetic attention: no llama.cpp involved."""

from __future__ import annotations

import numpy as np
import pytest

from kvchat.errors import SettingsError
from kvchat.policy import HeadReduction, PrunePlan, SnapKV, merge_runs, pool_scores, reduce_votes, spans_from_pieces
from kvchat.policy.spans import CHUNK_TOKENS

from tests.inspect_helpers import drop_runs

N_LAYERS, N_HEADS = 3, 4


def plan_of(method, votes, **options):
    """The method's plan for as many positions as `votes` covers, its own window observing."""
    return method.plan(votes.shape[-1], method.window, votes, **options)


def synthetic_votes(n_tokens: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random((N_LAYERS, N_HEADS, n_tokens)).astype(np.float32) * 0.01


@pytest.mark.parametrize("heads", list(HeadReduction))
def test_planted_needle_column_survives(heads: HeadReduction) -> None:
    votes = synthetic_votes(2000)
    votes[:, :2, 1234] += 5.0  # two heads of every layer look hard at position 1234
    plan = plan_of(SnapKV(budget=64, window=16, heads=heads, spans="none"), votes)
    assert 1234 in plan.kept


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pooling_keeps_neighbours(mode: str) -> None:
    votes = synthetic_votes(500)
    votes[:, :, 300] += 10.0
    plan = plan_of(SnapKV(budget=4 + 16 + 7, window=16, kernel=7, pool=mode, spans="none"), votes)
    assert set(range(297, 304)) <= set(plan.kept.tolist())


def test_pool_scores_shapes_and_values() -> None:
    scores = np.array([0, 0, 5, 0, 0, 0], dtype=np.float32)
    assert pool_scores(scores, 3, "max").tolist() == [0, 5, 5, 5, 0, 0]
    assert pool_scores(scores, 3, "avg").tolist() == pytest.approx([0, 5 / 3, 5 / 3, 5 / 3, 0, 0])
    assert pool_scores(np.ones((2, 3, 10)), 5, "max").shape == (2, 3, 10)
    with pytest.raises(ValueError):
        pool_scores(scores, 4, "max")


@pytest.mark.parametrize("kernel", [1, 3, 7, 15])
@pytest.mark.parametrize("length", [1, 2, 5, 40])
def test_pool_scores_match_a_sliding_window(kernel: int, length: int) -> None:
    """Same as max_pool1d / avg_pool1d(padding=kernel // 2, count_include_pad=True), windows
    wider than the row included."""
    scores = np.random.default_rng(kernel * 100 + length).random((2, 3, length)).astype(np.float32)
    half = kernel // 2
    windows = [scores[..., max(0, i - half) : i + half + 1] for i in range(length)]
    expected_max = np.stack([w.max(axis=-1) for w in windows], axis=-1)
    expected_avg = np.stack([w.sum(axis=-1) / kernel for w in windows], axis=-1)
    assert np.allclose(pool_scores(scores, kernel, "max"), expected_max)
    assert np.allclose(pool_scores(scores, kernel, "avg"), expected_avg, atol=1e-6)


@pytest.mark.parametrize("budget", [36, 100, 777])
@pytest.mark.parametrize("spans", ["none", "words", "sentences"])
def test_exact_budget_and_pins(budget: int, spans: str) -> None:
    n_tokens = 3000
    votes = synthetic_votes(n_tokens, seed=budget)
    votes[:, :, :4] = 0.0  # sinks get no votes: they must be kept anyway
    span_ids = np.arange(n_tokens) // (40 if spans == "sentences" else 5)
    policy = SnapKV(budget=budget, window=32, spans=spans)
    plan = plan_of(policy, votes, span_ids=span_ids)
    assert len(plan.kept) == budget
    kept = set(plan.kept.tolist())
    assert set(range(4)) <= kept
    assert set(range(n_tokens - 32, n_tokens)) <= kept
    assert np.all(np.diff(plan.kept) > 0)


def test_budget_at_least_prompt_keeps_everything() -> None:
    plan = plan_of(SnapKV(budget=1024), synthetic_votes(700))
    assert len(plan.kept) == 700 and drop_runs(plan) == []


def test_extra_pins_are_kept() -> None:
    votes = synthetic_votes(1000)
    extra = np.zeros(1000, dtype=bool)
    extra[500:520] = True
    plan = plan_of(SnapKV(budget=100, window=16), votes, extra_pins=extra)
    assert set(range(500, 520)) <= set(plan.kept.tolist()) and len(plan.kept) == 100 + 20


def test_the_positions_chosen_first_are_kept_within_the_budget_and_the_votes_choose_the_rest() -> None:
    votes = synthetic_votes(1000)
    votes[..., 300:310] = 1.0  # the votes' own winners
    first = np.zeros(1000, dtype=bool)
    first[500:540] = True
    plan = plan_of(SnapKV(budget=100, window=16, words=0.4), votes, first=first)
    kept = set(plan.kept.tolist())
    assert len(plan.kept) == 100 and set(range(500, 540)) | set(range(300, 310)) | {0, 1, 2, 3} <= kept
    assert set(range(984, 1000)) <= kept  # the window
    too_many = np.zeros(1000, dtype=bool)
    too_many[100:900] = True  # more than the budget has room for: the earliest, up to it
    plan = plan_of(SnapKV(budget=100, window=16), votes, first=too_many)
    assert plan.kept.tolist() == [0, 1, 2, 3, *range(100, 180), *range(984, 1000)]


@pytest.mark.parametrize(("budget", "words", "tokens"), [(1024, 0.25, 256), (1024, 0.0, 0), (64, 0.25, 16), (64, 1.0, 28)])
def test_the_words_share_is_of_the_budget_and_at_most_what_the_window_and_sinks_leave(budget: int, words: float, tokens: int) -> None:
    assert SnapKV(budget=budget, words=words).word_tokens == tokens


def test_merged_disjoint_runs() -> None:
    assert merge_runs(np.array([1, 2, 3, 7, 9, 10])) == [(1, 4), (7, 8), (9, 11)]
    assert merge_runs(np.array([], dtype=np.int64)) == []
    plan = PrunePlan(n_tokens=12, kept=np.array([0, 4, 5, 6, 8, 11]))
    runs = drop_runs(plan)
    assert runs == [(1, 4), (7, 8), (9, 11)]
    covered = [p for p0, p1 in runs for p in range(p0, p1)]
    assert sorted(covered + plan.kept.tolist()) == list(range(12))


def test_span_aware_keeps_whole_number() -> None:
    pieces = ["The", " number", " is", ":", " ", "7", "0", "0", "7", "0", "7", "1", ".", " Next"] + [" word"] * 200
    n_tokens = len(pieces)
    votes = synthetic_votes(n_tokens)
    votes[:, :, 6] += 3.0  # only one digit wins the vote
    span_ids = spans_from_pieces(pieces)
    with_spans = plan_of(SnapKV(budget=4 + 8 + 10, window=8, kernel=1, spans="words"), votes, span_ids=span_ids)
    without = plan_of(SnapKV(budget=4 + 8 + 10, window=8, kernel=1, spans="none"), votes, span_ids=span_ids)
    digits = set(range(5, 12))
    assert digits <= set(with_spans.kept.tolist())
    assert not digits <= set(without.kept.tolist())


def test_spans_from_pieces() -> None:
    ids = spans_from_pieces([" The", " value", " 1", "2", ",", "3", "4", " is", " un", "believ", "able", "."])
    assert ids[2] == ids[3] == ids[4] == ids[5] == ids[6]  # " 12,34" is one number
    assert ids[8] == ids[9] == ids[10]  # " unbelievable" is one word
    assert len(set(ids.tolist())) == 6
    assert spans_from_pieces(["7"] * 40).max() == 2  # long runs are capped at 16 tokens


@pytest.mark.parametrize(
    "kwargs",
    [{"budget": 30, "window": 32}, {"kernel": 4}, {"pool": "median"}, {"window": 0}],
)
def test_invalid_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(SettingsError):
        SnapKV(**kwargs)


def _settings_refusals() -> list:
    from kvchat.engine import AskSettings, KvLayout, StreamSettings
    from kvchat.llama import SamplerSettings

    cases = [
        ("window", SnapKV, {"window": 0}),
        ("budget", SnapKV, {"budget": 8}),
        ("kernel", SnapKV, {"kernel": 4}),
        ("pool", SnapKV, {"pool": "median"}),
        ("words", SnapKV, {"words": 1.5}),
        ("words", SnapKV, {"words": -0.25}),
        ("max_tokens", AskSettings, {"max_tokens": 0}),
        ("threads", AskSettings, {"threads": 0}),
        ("threads", AskSettings, {"threads": -3}),
        ("n_ctx", AskSettings, {"n_ctx": -5}),
        ("window", AskSettings, {"method": SnapKV(budget=1024, window=600)}),
        ("cache_type_k", AskSettings, {"layout": KvLayout(type_k="q4_0")}),
        ("flash attention", KvLayout, {"type_v": "q8_0"}),
        ("temperature", SamplerSettings, {"temperature": -1}),
        ("temperature", SamplerSettings, {"temperature": float("nan")}),
        ("top-k", SamplerSettings, {"top_k": -1}),
        ("top-p", SamplerSettings, {"top_p": 0}),
        ("top-p", SamplerSettings, {"top_p": 1.5}),
        ("min-p", SamplerSettings, {"min_p": -0.1}),
        ("chunk", StreamSettings, {"chunk": 0}),
        ("chunk", StreamSettings, {"chunk": -5}),
        ("recent", StreamSettings, {"recent": -10}),
        ("carry", StreamSettings, {"carry": 1.5}),
    ]
    return [pytest.param(setting, cls, kwargs, id=f"{cls.__name__}-{i}") for i, (setting, cls, kwargs) in enumerate(cases)]


@pytest.mark.parametrize(("setting", "settings_class", "kwargs"), _settings_refusals())
def test_settings_errors_name_the_setting_and_no_cli_flag(setting: str, settings_class: type, kwargs: dict) -> None:
    """The CLI, the TUI and the server share these objects: a hint like "--window 32" means
    nothing to an API client (the server once answered kv_budget 8 with it)."""
    with pytest.raises(SettingsError) as refused:
        settings_class(**kwargs)
    assert setting in refused.value.message and refused.value.hint
    assert "--" not in refused.value.one_line()


def test_sentence_spans_end_at_sentence_ends_and_line_breaks() -> None:
    pieces = ["The", " term", " is", " one", " (", "1", ")", " year", ".", " Notice", " is", " 60", " days", ";",
              " or", "\n", "Clause", " 3", ".", "5", " applies"] + [" word"] * 100
    span_ids = spans_from_pieces(pieces, "sentences")
    groups = ["".join(p for p, s in zip(pieces, span_ids) if s == span) for span in dict.fromkeys(span_ids.tolist())]
    assert groups[:4] == ["The term is one (1) year.", " Notice is 60 days;", " or", "\n"]
    assert groups[4].startswith("Clause 3.5 applies word")  # "3.5" is no sentence end
    assert np.bincount(span_ids)[4:].tolist() == [48, 48, 9]  # long runs are cut at 48 tokens
    assert spans_from_pieces(pieces, "none").tolist() == list(range(len(pieces)))
    assert spans_from_pieces(["", "a", "", " b.", " c"], "sentences").tolist() == [0, 0, 0, 0, 1]  # empty pieces (special tokens)


def test_chunk_spans_are_runs_of_chunk_tokens_whatever_they_hold() -> None:
    span_ids = spans_from_pieces(["The", " term", ".", "\n"] * 20, "chunks")
    assert np.bincount(span_ids).tolist() == [CHUNK_TOKENS, CHUNK_TOKENS, 80 - 2 * CHUNK_TOKENS]


def test_sentence_spans_keep_the_words_around_a_winner() -> None:
    pieces = ["Warranty", ":", " one", " (", "1", ")", " year", " from", " delivery", "."] + [" filler", "."] * 100
    votes = synthetic_votes(len(pieces))
    votes[:, :, 6] += 3.0  # only "year" wins the vote
    budget = 4 + 8 + 10
    kept = set(plan_of(SnapKV(budget=budget, window=8, kernel=1, spans="sentences"), votes,
                       span_ids=spans_from_pieces(pieces, "sentences")).kept.tolist())
    assert set(range(10)) <= kept
    words = set(plan_of(SnapKV(budget=budget, window=8, kernel=1, spans="words"), votes,
                        span_ids=spans_from_pieces(pieces, "words")).kept.tolist())
    assert 6 in words and not set(range(10)) <= words


def test_max_reduction_scores_the_most_any_one_head_gave() -> None:
    votes = np.zeros((2, 3, 5))
    votes[0, 1, 2], votes[1, 0, 2], votes[1, 2, 4] = 0.5, 0.25, 0.6  # position 4: one strong head
    votes[:, :, 3] = 0.2  # position 3: every head a little (1.2 summed)
    candidates = np.ones(5, dtype=bool)
    candidates[0] = False
    assert reduce_votes(votes, candidates, HeadReduction.MAX, 2).tolist() == [-np.inf, 0.0, 0.5, 0.2, 0.6]
    summed = reduce_votes(votes, candidates, HeadReduction.SUM, 2)
    assert np.argsort(-summed)[:3].tolist() == [3, 2, 4]  # the order max turns around


def test_snapkv_refuses_an_unknown_span_mode() -> None:
    with pytest.raises(SettingsError, match="spans must be one of none, words, sentences, chunks"):
        SnapKV(spans="paragraphs")  # type: ignore[arg-type]


def test_per_head_selection_keeps_each_heads_own_choice_and_every_pin_in_each() -> None:
    votes = synthetic_votes(2000)[:, :2]  # per KV head, as the cache sums each GQA group
    votes[0, 1, 1234] += 5.0  # one head of one layer looks hard at position 1234
    extra = np.zeros(2000, dtype=bool)
    extra[1500:1510] = True  # an earlier turn
    plan = SnapKV(budget=64, window=16, heads=HeadReduction.PER_HEAD, spans="none").plan(2000, 16, votes, extra_pins=extra)
    assert plan.head_kept is not None and plan.head_kept.shape == (N_LAYERS, 2, 64 + 10)
    pinned = np.r_[0:4, 1500:1510, 1984:2000]
    for row in plan.head_kept.reshape(-1, 74):
        assert np.all(np.diff(row) > 0) and set(pinned) <= set(row.tolist())
    assert 1234 in plan.head_kept[0, 1] and 1234 in plan.kept
    assert np.array_equal(plan.kept, np.unique(plan.head_kept))


def test_heads_cannot_be_reduced_per_head() -> None:
    with pytest.raises(ValueError, match="nothing to reduce"):
        reduce_votes(synthetic_votes(100), np.ones(100, dtype=bool), HeadReduction.PER_HEAD, 10)
