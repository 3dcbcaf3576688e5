"""Settings of one ask: the method, generation limits, the sampler and the KV cache layout."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvchat.errors import SettingsError
from kvchat.llama import CACHE_TYPES, ContextSettings, SamplerSettings, available_cpus
from kvchat.policy import SPAN_MODES, HeadReduction, Method, SnapKV

REDUCTIONS = tuple(r.value for r in HeadReduction if r is not HeadReduction.PER_HEAD)  # one set of tokens to re-read

DEFAULT_MAX_TOKENS = 512
READS = ("auto", "full", "fast", "retrieval")
CHOOSERS = ("attention", "bm25", "fused")
# Threads for each CPU kvchat may use, at most: llama.cpp's threads meet after every op, so more
# only wait on each other (-t 1000 on 2 CPUs: 26 s to the first token, not 0.7 s), and far more
# crash it (-t 100000: SIGSEGV; 10^20 from a settings file: std::bad_alloc).
MAX_THREADS_PER_CPU = 4


@dataclass(frozen=True)
class KvLayout:
    """How the KV cache holds its entries. Saved readings and the server's shared context must
    agree with the context that read a prompt: llama.cpp lays V out differently with flash
    attention on, and a quantized cache holds other bytes."""

    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"

    def context(self, n_ctx: int, n_batch: int, threads: int | None, n_seq_max: int = 1, kv_unified: bool = False) -> ContextSettings:
        """The settings of a llama.cpp context of `n_ctx` cells laid out so: the one way every
        context of a reading, a sequence of the server or an answer's sources is made."""
        return ContextSettings(n_ctx=n_ctx, n_batch=n_batch, threads=threads, flash_attn=self.flash_attn, type_k=self.type_k,
                               type_v=self.type_v, n_seq_max=n_seq_max, kv_unified=kv_unified)

    def __post_init__(self) -> None:
        for name, cache_type in (("k", self.type_k), ("v", self.type_v)):
            if cache_type not in CACHE_TYPES:
                raise SettingsError(f"unknown KV cache type {cache_type!r}", f"use a {name.upper()} cache type of f16 or q8_0")
        if self.type_v != "f16" and not self.flash_attn:
            raise SettingsError(
                f"a {self.type_v} V cache needs flash attention (llama.cpp quantizes V only inside it)",
                "turn flash attention on, or keep the V cache type at f16",
            )


@dataclass(frozen=True)
class FastSettings:
    """How a fast reading's cheap pass chooses and what the model re-reads (reading/fast.py): what the
    bench varies; a user leaves them at their defaults."""

    depth: float | None = None  # None: the registry's share for the model that reads (models.cheap_depth)
    positions: str = "consecutive"  # or "original": the chosen tokens moved back to their own positions
    layers: int = 1  # the cheap pass's last layers whose attention chooses (1: its last, as GemFilter)
    # The tokens the whole model reads again after the cheap pass; None: the budget, or four times it
    # with a draft (fast.DRAFT_REREAD). More than the budget: the question's attention over that
    # re-reading then keeps the budget's, as SnapKV does.
    reread: int | None = None
    # How the cheap pass groups the tokens it chooses for the re-reading (policy/spans.py) and
    # reduces its heads' votes (policy/scoring.py): whole sentences or clauses, each scored by the
    # strongest head, as Speculative Prefill scores its chunks; choosing as the method keeps (words,
    # summed) lost real-contract answers, and 32-token chunks cut clauses through (docs/how-it-works.md,
    # "Reading fast").
    spans: str = "sentences"
    heads: str = "max"
    # Who chooses what the model re-reads (reading/passages.py): the cheap pass's attention, the
    # question's words (BM25 over the document's passages, attention where it shares none with
    # them), or both, their rankings of the passages fused. `narrow`: the cheap pass reads only the
    # BM25 best passages of this many times the re-reading (None: the whole prompt).
    choose: str = "attention"
    narrow: int | None = None
    opening: int = 0  # the document's first passages, read whatever the question chooses (its title, parties, date)

    def __post_init__(self) -> None:
        if self.positions not in ("consecutive", "original"):
            raise SettingsError(f"unknown fast reading positions {self.positions!r}", "use consecutive or original")
        if self.layers < 1:
            raise SettingsError(f"the fast reading scores from at least 1 layer, got {self.layers}", "use 1 (its last layer) or more")
        if self.depth is not None and not 0 < self.depth <= 1:
            raise SettingsError(f"the fast reading's depth must be in (0, 1], got {self.depth}", "0.5 reads with the first half of the layers")
        if self.spans not in SPAN_MODES:
            raise SettingsError(f"unknown fast reading spans {self.spans!r}", f"use one of {', '.join(SPAN_MODES)}")
        if self.heads not in REDUCTIONS:
            raise SettingsError(f"unknown fast reading heads {self.heads!r}", f"use one of {', '.join(REDUCTIONS)}")
        if self.choose not in CHOOSERS:
            raise SettingsError(f"unknown fast reading chooser {self.choose!r}", f"use one of {', '.join(CHOOSERS)}")
        if self.opening < 0:
            raise SettingsError(f"the fast reading's opening passages cannot be negative, got {self.opening}", "use 0 or more")
        if self.narrow is not None and self.narrow < 1:
            raise SettingsError(f"the cheap pass narrows to at least the re-reading, got {self.narrow}x", "use 1 or more, or leave it unset")


# How the default (read "auto") reads a new document's first question: the passages its words
# choose (BM25) and the document's opening passage, read alone. On the 48 dev cuad questions it
# answered 43 where BM25 alone answered 40 and BM25 fused with the draft's attention 37, in 1.15x
# BM25's time (docs/how-it-works.md, "Reading what the question chooses"). Only with a draft: a
# question that shares no word with the document is chosen by its attention, and the model's own
# first layers lost answers where a draft's did not ("Reading fast").
AUTO_READING = FastSettings(choose="bm25", opening=1)

MIN_PART_TOKENS = 256  # a part smaller than this says too little to be worth its answer
DEFAULT_PART_TOKENS = 2048
WHOLES = ("auto", "on", "off")


@dataclass(frozen=True)
class AskSettings:
    """Built by the CLI, the TUI and the server alike: errors name settings, never one front end's flags."""

    method: Method = field(default_factory=SnapKV)
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    n_ctx: int | None = None
    n_batch: int = 512  # tokens read per llama_decode call: a reading's chunk and the largest window
    threads: int | None = None
    layout: KvLayout = field(default_factory=KvLayout)  # flash attention on: scores from the query probe
    # A document longer than the model's context is read streamed (SnapStream with the method's
    # options) instead of refused; front ends turn it off when the user names the method.
    auto_stream: bool = True
    # Each answer names the passages it drew on (answering/sources.py): its tokens are decoded once more
    # with the attention probe on, after the answer.
    sources: bool = True
    # "fast": the first question about a document is answered from a fast reading: the first
    # `fast.depth` of the layers of a draft model (or of the model's own) read the whole prompt,
    # their attention chooses the tokens, and the whole model reads only those (GemFilter,
    # Speculative Prefill). A follow-up reads the whole document first. "full": every layer reads
    # it all. "auto" (the default): fast where it was measured answering as a full reading does,
    # with a draft model and a method that chooses as snapkv does, on a prompt long enough for it
    # to pay (docs/how-it-works.md, "Reading fast"); full otherwise, without a word. "retrieval":
    # fast, the passages the question's words choose (BM25) read alone, as retrieval tools read.
    read: str = "auto"
    fast: FastSettings = field(default_factory=FastSettings)
    # The system prompt; None: kvchat's (answer from the document only, quote exactly, keep it
    # short). It is part of the document's prompt, so each one has its own saved reading.
    system: str | None = None
    # A question about the whole document (a summary, a list, a comparison): answered from all of
    # it, in parts of `part_tokens` tokens, each asked the question in turn, the answer each part's
    # (in_parts.py). "auto": the questions whose wording asks about the whole (whole_question.py);
    # "on": every question; "off": none, each answered from the entries its question keeps.
    whole: str = "auto"
    part_tokens: int = DEFAULT_PART_TOKENS
    # The most cells a question's prompt may keep for its answer, its earlier turns pinned whole
    # among them: a server's sequence holds so many (reading/sizing.check_prompt); None: as many
    # as the context holds.
    kept_cells: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise SettingsError(f"max tokens must be at least 1, got {self.max_tokens}", f"ask for at least 1 token ({DEFAULT_MAX_TOKENS} is the default)")
        if self.threads is not None:
            _check_threads(self.threads)
        if self.n_ctx is not None and self.n_ctx < 1:
            raise SettingsError(f"context size must be at least 1, got {self.n_ctx}", "leave it unset to fit the prompt")
        if self.system is not None and not self.system.strip():
            raise SettingsError("the system prompt is empty", "leave `system` out for kvchat's, or give one")
        if self.whole not in WHOLES:
            raise SettingsError(f"unknown whole-document answering {self.whole!r}", "use auto, on or off")
        if self.part_tokens < MIN_PART_TOKENS:
            raise SettingsError(f"a whole-document answer reads parts of at least {MIN_PART_TOKENS} tokens, got {self.part_tokens}",
                                f"use parts of {MIN_PART_TOKENS} tokens or more")
        if self.read not in READS:
            raise SettingsError(f"unknown reading {self.read!r}", "read auto, full, fast or retrieval")
        if self.read in ("fast", "retrieval") and not self.method_reads_fast:
            if not self.method.scores or self.method.streams:
                raise SettingsError(f"a fast reading chooses tokens as snapkv does, not with {self.method.name}", "use snapkv, or read full")
            raise SettingsError("a fast reading chooses one set of tokens to read again, not one per head", "use `heads` sum, or `read` full")
        if self.fast.reread is not None and self.fast.reread < self.method.budget:
            raise SettingsError(f"a fast reading re-reads at least the budget's {self.method.budget} tokens, got {self.fast.reread}",
                                "re-read the budget (unset) or more")
        if self.n_batch < 1:
            raise SettingsError(f"the batch size must be at least 1 token, got {self.n_batch}", "leave `n_batch` at 512")
        if self.method.window > self.n_batch:
            raise SettingsError(
                f"window {self.method.window} is larger than the batch size {self.n_batch}",
                f"use a `window` of {self.n_batch} or less, or a larger `n_batch`",
            )

    @property
    def method_reads_fast(self) -> bool:
        """The method chooses one set of tokens by attention after reading, as snapkv does: what a
        fast reading's cheap pass chooses and the model re-reads."""
        return self.method.scores and not self.method.streams and not self.method.per_head

    def reads_fast(self, with_draft: bool) -> bool:
        """Whether a new document's first question is answered from a fast reading: asked for, or
        by default (auto) with a draft model and a method that reads fast; the prompt's length
        decides after (fast.pays)."""
        if self.read == "auto":  # the question's words choose, a draft's attention where they find nothing
            return with_draft and self.method_reads_fast
        return self.read in ("fast", "retrieval")

    @property
    def fast_reading(self) -> FastSettings:
        """How a fast reading chooses what it reads: the question's words alone for a retrieval
        reading, AUTO_READING's way by default (auto), `fast` as set otherwise."""
        if self.read == "retrieval":
            return replace(self.fast, choose="bm25")
        return AUTO_READING if self.read == "auto" else self.fast


def _check_threads(threads: int) -> None:
    """Refuse a thread count llama.cpp would crash on or crawl with (MAX_THREADS_PER_CPU)."""
    if threads < 1:
        raise SettingsError(f"threads must be at least 1, got {threads}", "use 1 or more threads, or leave it unset for all cores")
    cpus = available_cpus()
    if threads > MAX_THREADS_PER_CPU * cpus:
        raise SettingsError(f"`threads` must be at most {MAX_THREADS_PER_CPU * cpus} ({MAX_THREADS_PER_CPU} for each of the "
                            f"{cpus} CPUs kvchat may use), got {threads:,}", "leave it unset for every CPU kvchat may use")
