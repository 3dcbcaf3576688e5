"""How one ask carries out the user's settings (user_settings.py): the method, generation limits, the sampler and the KV cache layout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any

from kvchat.engine.user_settings import UserSettings, user_settings
from kvchat.errors import SettingsError
from kvchat.events import LaterReading
from kvchat.llama import ContextSettings, SamplerSettings, gpu_offload_supported
from kvchat.policy import SPAN_MODES, HeadReduction, Method, SnapKV, method_carrying, window_for

REDUCTIONS = tuple(r.value for r in HeadReduction if r is not HeadReduction.PER_HEAD)  # one set of tokens to re-read

USER = UserSettings()  # kvchat's defaults of the settings a user chooses
CHOOSERS = ("attention", "bm25")
OPENING_FOR = ("every", "document")
METHOD_OPTIONS = ("budget", "window", "kernel", "pool", "heads", "spans")  # the settings a method carries


@dataclass(frozen=True)
class KvLayout:
    """How the KV cache holds its entries. Saved readings and the server's shared context must
    agree with the context that read a prompt: llama.cpp lays V out differently with flash
    attention on, and a quantized cache holds other bytes."""

    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"

    def context(self, n_ctx: int, n_batch: int, threads: int | None, n_seq_max: int = 1) -> ContextSettings:
        """The settings of a llama.cpp context of `n_ctx` cells laid out so: the one way every
        context of a reading, a sequence of the server or an answer's sources is made."""
        return ContextSettings(n_ctx=n_ctx, n_batch=n_batch, threads=threads, flash_attn=self.flash_attn, type_k=self.type_k,
                               type_v=self.type_v, n_seq_max=n_seq_max)

    def __post_init__(self) -> None:
        if self.type_v != "f16" and not self.flash_attn:
            raise SettingsError(
                f"a {self.type_v} V cache needs flash attention (llama.cpp quantizes V only inside it)",
                "turn flash attention on, or keep the V cache type at f16",
            )


@dataclass(frozen=True)
class FastSettings:
    """How a fast reading's cheap pass chooses and what the model re-reads (reading/cheap_pass.py): what the
    bench varies; a user leaves them at their defaults."""

    depth: float | None = None  # None: the registry's share for the model that reads (models.cheap_depth)
    positions: str = "consecutive"  # or "original": the chosen tokens moved back to their own positions
    layers: int = 1  # the cheap pass's last layers whose attention chooses (1: its last, as GemFilter)
    # The tokens the whole model reads again after the cheap pass; None: the budget, or four times it
    # with a draft (cheap_pass.DRAFT_REREAD). More than the budget: the question's attention over that
    # re-reading then keeps the budget's, as SnapKV does.
    reread: int | None = None
    # How the cheap pass groups the tokens it chooses (policy/spans.py) and reduces its heads' votes
    # (policy/scoring.py): whole sentences, each scored by its strongest head (docs/bench/design-history.md, "The fast reading chooses passages by their strongest head").
    spans: str = "sentences"
    heads: str = "max"
    # Who chooses what the model re-reads (text/passages.py): the cheap pass's attention, or the
    # question's words (BM25 over the document's passages, attention where it shares none with them).
    choose: str = "attention"
    opening: int = 0  # the document's first passages, read whatever the question chooses (its title, parties, date)
    # Which questions the words choose the opening for (passages.names_the_document): every one, or
    # only one that names the document itself ("this agreement"), whose answer may be in the
    # opening's words and not in its own; the attention's choice reads it for every question.
    opening_for: str = "every"

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
        if self.opening_for not in OPENING_FOR:
            raise SettingsError(f"unknown fast reading opening_for {self.opening_for!r}", f"use one of {', '.join(OPENING_FOR)}")


# How the default (read "auto") reads a new document's first question: the passages its words
# choose, and the opening passage for a question that names the document, with a draft
# (docs/bench/design-history.md, "The first answer reads the passages its question's words choose").
AUTO_READING = FastSettings(choose="bm25", opening=1, opening_for="document")


@dataclass(frozen=True)
class StreamSettings:
    """How a document too long to read whole is read streamed (reading/chunked.py): `chunk` and
    `recent` are the user's settings of the same names; the others are what the bench varies."""

    chunk: int = USER.chunk
    recent: int = USER.recent
    query_aware: bool = True
    carry: float = 0.0  # weight of a surviving cell's earlier votes in the next scoring

    def __post_init__(self) -> None:
        if self.chunk < 1:  # the reading advances by a chunk: 0 would never finish
            raise SettingsError(f"chunk must be at least 1 token, got {self.chunk}", "use a chunk of e.g. 512 tokens")
        if self.recent < 1:  # the recent ring is the observation window of each eviction
            raise SettingsError(f"recent must be at least 1 token, got {self.recent}", "keep e.g. 64 recent tokens")
        if not 0 <= self.carry <= 1:
            raise SettingsError(f"carry must be between 0 and 1, got {self.carry}", "use 0 to score each eviction afresh")


MIN_PART_TOKENS = 256  # a part smaller than this says too little to be worth its answer
DEFAULT_PART_TOKENS = 2048


@dataclass(frozen=True)
class AskSettings:
    """Built by the CLI, the TUI and the server alike (ask_settings): errors name settings, never
    one front end's flags. The fields named as a user's setting hold it as it is (UserSettings,
    where their meanings are written); the method, sampler and layout hold the others."""

    method: Method = field(default_factory=SnapKV)
    max_tokens: int = USER.max_tokens
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    n_ctx: int | None = None
    n_batch: int = USER.n_batch  # tokens read per llama_decode call: a reading's chunk and the largest window
    threads: int | None = None
    layout: KvLayout = field(default_factory=KvLayout)  # flash attention on: scores from the query probe
    # The user named the method: kvchat keeps it. Unnamed (the default), kvchat reads a document
    # longer than the model's context streamed (SnapStream with the method's options) rather than
    # refuse it, and answers from the whole cache on a GPU (reading/sizing.reading_settings).
    method_named: bool = False
    sources: bool = USER.sources  # after the answer, its tokens are decoded once more with the attention probe on
    read: str = USER.read
    fast: FastSettings = field(default_factory=FastSettings)
    system: str | None = USER.system  # part of the document's prompt: each one has its own saved reading
    in_parts: str = USER.in_parts
    part_tokens: int = DEFAULT_PART_TOKENS  # the size of each part a question answered in parts reads
    stream: StreamSettings = field(default_factory=StreamSettings)
    select: str = USER.select  # how a conversation's questions choose what they keep (selections/)
    # The most cells a question's prompt may keep for its answer, its earlier turns pinned whole
    # among them: a server's sequence holds so many (reading/sizing.check_prompt); None: as many
    # as the context holds.
    kept_cells: int | None = None

    def __post_init__(self) -> None:
        user_settings(self.held_settings())  # a value the front end did not check (the bench's variants) is refused as a user's
        if self.part_tokens < MIN_PART_TOKENS:
            raise SettingsError(f"an answer in parts reads parts of at least {MIN_PART_TOKENS} tokens, got {self.part_tokens}",
                                f"use parts of {MIN_PART_TOKENS} tokens or more")
        if self.read in ("fast", "retrieval") and not self.method_reads_fast:
            if not self.method.scores or self.method.streams:
                raise SettingsError(f"a fast reading chooses tokens as snapkv does, not with {self.method.name}", "use snapkv, or read full")
            raise SettingsError("a fast reading chooses one set of tokens to read again, not one per head", "use `heads` sum, or `read` full")
        if self.fast.reread is not None and self.fast.reread < self.method.budget:
            raise SettingsError(f"a fast reading re-reads at least the budget's {self.method.budget} tokens, got {self.fast.reread}",
                                "re-read the budget (unset) or more")
        if self.method.window > self.n_batch:
            raise SettingsError(
                f"window {self.method.window} is larger than the batch size {self.n_batch}",
                f"use a `window` of {self.n_batch} or less, or a larger `n_batch`",
            )

    def held_settings(self) -> dict[str, Any]:
        """The user's settings these hold, by their names (UserSettings): the method's name and options among them."""
        held = {name: getattr(self, name) for name in _held_as_they_are()}
        method = {name: getattr(self.method, name) for name in METHOD_OPTIONS if hasattr(self.method, name)}
        return {**held, **method, "method": self.method.name, "temperature": self.sampler.temperature, "seed": self.sampler.seed,
                "cache_type_k": self.layout.type_k, "cache_type_v": self.layout.type_v, "chunk": self.stream.chunk,
                "recent": self.stream.recent}

    @property
    def method_reads_fast(self) -> bool:
        """The method chooses one set of tokens by attention after reading, as snapkv does: what a
        fast reading's cheap pass chooses and the model re-reads."""
        return self.method.scores and not self.method.streams and not self.method.per_head

    def reads_fast(self, with_draft: bool) -> bool:
        """Whether the questions about a new document are answered from fast readings until it is
        read whole: asked for, or by default (auto) with a draft model and a method that reads
        fast; the prompt's length decides after (cheap_pass.pays), and for a question asked while the
        whole reading goes on, which is sooner (Conversation.select)."""
        if self.read == "auto":  # the question's words choose, a draft's attention where they find nothing
            return with_draft and self.method_reads_fast
        return self.read in ("fast", "retrieval")

    @property
    def later_reading(self) -> LaterReading | None:
        """What a document whose questions read fast is read as afterwards, in the background, for
        the questions after: its passages, each alone (a passage bank, from which a
        follow-up loads the passages it chooses and reads none of them) by default (auto); whole
        (the follow-ups selected from that reading) for a fast reading asked for by name;
        nothing for retrieval, whose every question reads the passages its words choose, as
        retrieval tools answer."""
        if self.read == "retrieval":
            return None
        return LaterReading.PASSAGES if self.read == "auto" else LaterReading.WHOLE

    @property
    def fast_reading(self) -> FastSettings:
        """How a fast reading chooses what it reads: the question's words alone for a retrieval
        reading, AUTO_READING's way by default (auto), `fast` as set otherwise."""
        if self.read == "retrieval":
            return replace(self.fast, choose="bm25")
        return AUTO_READING if self.read == "auto" else self.fast


def ask_settings(user: UserSettings, **engine: Any) -> AskSettings:
    """AskSettings carrying out the user's settings; `engine`: those a front end sets itself (the
    server's method, sampler and layout; kept_cells …). A method left unnamed is the default one,
    which streams a document too long to read whole."""
    if "method" not in engine:
        engine["method"] = method_of(user)
    answer = {name: getattr(user, name) for name in _held_as_they_are()}
    layout = KvLayout(flash_attention(user.flash_attn, user.gpu_layers), user.cache_type_k, user.cache_type_v)
    return AskSettings(**{**answer, "method_named": user.method is not None, "layout": layout, "stream": StreamSettings(user.chunk, user.recent),
                          "sampler": SamplerSettings(temperature=user.temperature, seed=user.seed), **engine})


def method_of(user: UserSettings, carried: Mapping[str, object] | None = None) -> Method:
    """The method the user's settings name (the default one if none) with the options they set,
    those left unset (None) its defaults; an option the method has not is an error that names
    those it has. Of `carried`, settings brought from elsewhere (the server's heads for every
    method, the chat form's pooling shown for every method), those the method has. An unset
    window is the default one, or the longest a small budget has room for (window_for), on every
    front end alike."""
    options: dict[str, object] = {name: getattr(user, name) for name in METHOD_OPTIONS if getattr(user, name) is not None}
    options.setdefault("window", window_for(user.budget))
    carried = dict(carried or {})
    for held in (options, carried):
        if isinstance(held.get("heads"), str):
            held["heads"] = HeadReduction(held["heads"])
    return method_carrying(user.method or SnapKV.name, carried, **options)


@cache
def _held_as_they_are() -> tuple[str, ...]:
    """AskSettings' fields that hold a user's setting as it is (max_tokens, read …)."""
    return tuple(each.name for each in fields(AskSettings) if each.name in UserSettings.model_fields and each.name != "method")


def flash_attention(choice: str, gpu_layers: int) -> bool:
    """flash_attn on|off|auto; auto is on when layers run on a GPU (where the fused kernel saves
    memory and time) and off on the CPU (where reading the softmax is exact and cheaper)."""
    return choice == "on" or (choice == "auto" and gpu_layers > 0 and gpu_offload_supported())
