"""A llama.cpp context: batched decode with explicit positions, logits and the KV operations."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvchat.errors import DecodeError, KvCacheFullError, ModelError, SettingsError
from kvchat.llama._lib import raw
from kvchat.llama.model import CACHE_TYPE_BLOCK, CACHE_TYPE_BYTES, LlamaModel
from kvchat.llama.composite import composite_state
from kvchat.llama.cpu import available_cpus
from kvchat.llama.probe import AttentionProbe
from kvchat.llama.query_probe import QueryProbe
from kvchat.llama.state import cell_positions

DECODE_ABORTED = 2  # llama_decode's code where the abort callback stopped it

# A saved sequence state: bytes are copied into C; a writable buffer (a bytearray, or a
# memoryview of a mapped state file) is passed without a copy.
StateBytes = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int
    n_batch: int = 512
    threads: int | None = None  # decoding a token at a time (llama.cpp's n_threads)
    threads_batch: int | None = None  # reading a prompt in batches (n_threads_batch)
    flash_attn: bool = False
    n_seq_max: int = 1
    type_k: str = "f16"  # KV cache types: f16, q8_0 or f32 (a quantized V needs flash attention)
    type_v: str = "f16"
    # Scores from queries and keys even with flash attention off, where the softmax could be read:
    # compares the two probes on one context (flash attention changes the numbers themselves).
    query_scores: bool = False

    def thread_count(self) -> int:
        return self.threads or available_cpus()

    def batch_thread_count(self) -> int:
        return self.threads_batch or self.thread_count()


def max_sequences() -> int:
    """The most sequences llama.cpp holds in one context (LLAMA_MAX_SEQ): it refuses a context of more."""
    return int(raw.llama_max_parallel_sequences())


def _check_cache_type(cache_type: str, head_dim: int) -> None:
    """Refuse a quantized cache whose blocks would straddle two attention heads: llama.cpp then
    scores each head from the wrong values on the CPU (the tiny test model's 16-wide heads in
    q8_0's 32-value blocks) and aborts on CUDA (`GGML_ASSERT(d_64 != 0)`)."""
    if cache_type not in CACHE_TYPE_BYTES:
        raise SettingsError(f"unknown cache type {cache_type!r}", "use f16 or q8_0")
    block = CACHE_TYPE_BLOCK[cache_type]
    if head_dim % block:
        raise SettingsError(
            f"a {cache_type} KV cache needs attention heads a multiple of {block} values wide; this model's are {head_dim}",
            "use f16 for `cache_type_k` and `cache_type_v`",
        )


class LlamaContext:
    """Owns a `llama_context`, its batch and the attention probe that fits its flash-attention setting."""

    def __init__(self, model: LlamaModel, settings: ContextSettings) -> None:
        self.model = model
        self.settings = settings
        self.probe = self._new_probe(model, settings)
        self._ctx = raw.llama_init_from_model(model.handle, self._params())
        if not self._ctx:
            raise ModelError(
                f"llama.cpp could not create a context of {settings.n_ctx} tokens",
                "lower `n_ctx` or `max_tokens`, free memory, or use f16 cache types (the log file has llama.cpp's reason)",
            )
        self._memory = raw.llama_get_memory(self._ctx)
        self._batch = raw.llama_batch_init(settings.n_batch, 0, settings.n_seq_max)
        self._shift_pending = False  # a shift() that the next decode applies

    def _new_probe(self, model: LlamaModel, settings: ContextSettings) -> AttentionProbe | QueryProbe:
        """Softmax outputs exist only with flash attention off; with it on, the scores are
        recomputed from the window's queries and the cached keys (sequence 0's state)."""
        shape = model.shape
        if not (settings.flash_attn or settings.query_scores):
            return AttentionProbe(shape.n_layer)
        probe = QueryProbe(shape.n_layer, shape.n_head, shape.n_head_kv, shape.head_dim)
        probe.state_source = lambda: self.state_bytes(0)
        return probe

    def _params(self) -> object:
        settings = self.settings
        params = raw.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = params.n_ubatch = settings.n_batch
        params.n_seq_max = settings.n_seq_max
        params.n_threads = settings.thread_count()
        params.n_threads_batch = settings.batch_thread_count()
        params.flash_attn_type = (
            raw.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attn else raw.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        for cache_type in (settings.type_k, settings.type_v):
            _check_cache_type(cache_type, self.model.shape.head_dim)
        params.type_k = CACHE_TYPE_BYTES[settings.type_k][0]
        params.type_v = CACHE_TYPE_BYTES[settings.type_v][0]
        params.no_perf = True
        params.cb_eval = self.probe.callback
        params.cb_eval_user_data = None
        return params

    def cut_after_layer(self, layer: int | None) -> None:
        """Stop every decode after `layer` (the cheap pass of a fast reading; see NodeWatcher),
        or run them whole again (None). The cells a cut decode writes are usable up to that
        layer only, and its logits not at all: remove them before a whole decode."""
        self.probe.cut_after(layer)

    @property
    def n_ctx(self) -> int:
        return raw.llama_n_ctx(self._ctx)

    # ---- decoding -------------------------------------------------------------------------

    def decode(self, tokens: list[int], start_pos: int, seq: int = 0, want_logits: bool = True) -> None:
        """Decode `tokens` at positions start_pos, start_pos+1, ... (at most n_batch at once)."""
        self._fill_batch(tokens, start_pos, seq, want_logits)
        self._raise_for(raw.llama_decode(self._ctx, self._batch))
        self._shift_pending = False

    def decode_unless(self, tokens: list[int], start_pos: int, stop: Callable[[], bool]) -> bool:
        """decode() into sequence 0 without logits, unless `stop()` turns true while it runs: the CPU
        asks between two nodes of the graph, and llama.cpp then removes the batch's cells (every
        position from `start_pos` on) and returns. Whether the batch was read. A GPU backend does
        not ask: its batches end. Nor does a decode that first applies a shift (shift()): llama.cpp
        would apply it again to the layers it had shifted before a stop."""
        if self._shift_pending:
            self.decode(tokens, start_pos, want_logits=False)
            return True
        self._fill_batch(tokens, start_pos, 0, want_logits=False)
        failed: list[BaseException] = []  # what stop() raised: ctypes would only print it

        def abort(_data: object) -> bool:
            try:
                return not failed and bool(stop())
            except BaseException as error:  # raised below, once llama.cpp has returned
                failed.append(error)
                return False

        callback = raw.ggml_abort_callback(abort)
        raw.llama_set_abort_callback(self._ctx, callback, None)
        try:
            code = raw.llama_decode(self._ctx, self._batch)
        finally:
            raw.llama_set_abort_callback(self._ctx, raw.ggml_abort_callback(), None)  # NULL: no Python call per node
        if failed:
            raise failed[0]
        if code == DECODE_ABORTED:
            return False
        self._raise_for(code)
        return True

    def _fill_batch(self, tokens: list[int], start_pos: int, seq: int, want_logits: bool) -> None:
        if len(tokens) > self.settings.n_batch:
            raise ValueError(f"batch of {len(tokens)} tokens exceeds n_batch {self.settings.n_batch}")
        batch = self._batch
        batch.n_tokens = len(tokens)
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = start_pos + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = seq
            batch.logits[index] = 0
        if want_logits:
            batch.logits[len(tokens) - 1] = 1

    def decode_many(self, tokens: list[int], positions: list[int], seqs: list[int]) -> None:
        """One decode step for several sequences at once (continuous batching): token i goes to
        sequence seqs[i] at positions[i]; logits are kept for every row (the sampler reads row i)."""
        if len(tokens) > self.settings.n_batch:
            raise ValueError(f"batch of {len(tokens)} tokens exceeds n_batch {self.settings.n_batch}")
        batch = self._batch
        batch.n_tokens = len(tokens)
        for index, (token, position, seq) in enumerate(zip(tokens, positions, seqs)):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = seq
            batch.logits[index] = 1
        self._raise_for(raw.llama_decode(self._ctx, batch))
        self._shift_pending = False

    @staticmethod
    def _raise_for(code: int) -> None:
        if code == 0:
            return
        if code == 1:
            raise KvCacheFullError("the KV cache is full", "raise `n_ctx` or lower `max_tokens`", code)
        if code == DECODE_ABORTED:
            raise DecodeError("decoding was aborted", "", code)
        if code == -1:
            raise DecodeError("llama.cpp rejected the batch as invalid", "this is a bug in kvchat", code)
        raise DecodeError(f"llama.cpp failed to decode (code {code})", "see the log file", code)

    @property
    def handle(self) -> object:
        return self._ctx

    # ---- KV operations --------------------------------------------------------------------

    def remove(self, seq: int, p0: int, p1: int) -> None:
        """Remove positions [p0, p1) of `seq` (p1 < 0: to the end)."""
        if not raw.llama_memory_seq_rm(self._memory, seq, p0, p1):
            raise DecodeError(f"llama.cpp could not remove positions [{p0}, {p1})", "this is a bug in kvchat")

    def remove_runs(self, seq: int, runs: list[tuple[int, int]]) -> None:
        for p0, p1 in runs:
            self.remove(seq, p0, p1)

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Add `delta` to positions [p0, p1); K is re-rotated lazily on the next decode."""
        raw.llama_memory_seq_add(self._memory, seq, p0, p1, delta)
        self._shift_pending = True  # llama.cpp applies it at the next decode

    def can_shift(self) -> bool:
        return bool(raw.llama_memory_can_shift(self._memory))

    def clear(self) -> None:
        raw.llama_memory_clear(self._memory, True)

    def state_bytes(self, seq: int = 0) -> bytes:
        """The sequence's KV entries as llama.cpp serialises them (llama_state_seq_get_data)."""
        size = raw.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = raw.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return bytes(memoryview(buffer)[:written])

    def load_state(self, data: StateBytes, seq: int = 0) -> None:
        """Restore a sequence state (see StateBytes)."""
        array_type = ctypes.c_uint8 * len(data)
        buffer = array_type.from_buffer_copy(data) if isinstance(data, bytes) else array_type.from_buffer(data)
        if raw.llama_state_seq_set_data(self._ctx, buffer, len(data), seq) == 0:
            raise DecodeError("llama.cpp could not restore the KV state", "the saved state does not fit this context")

    def compact(self, seq: int = 0) -> np.ndarray:
        """Move the sequence's cells to be contiguous from cell 0 (positions unchanged); returns
        the positions of the cells, in cell order, as written back.

        Removing entries leaves holes that attention still scans; a state round-trip writes the
        kept cells back densely, so decoding really gets faster.
        """
        data = self.state_bytes(seq)
        self.remove(seq, -1, -1)
        self.load_state(data, seq)
        return cell_positions(data)

    def compact_per_head(self, seq: int, sources: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rewrite the sequence as `len(positions)` cells from cell 0, cell i holding in layer l and
        KV head h what its cell `sources[l, h, i]` held there (composite.py); returns the positions
        written. A state laid out otherwise is refused before anything is removed."""
        try:
            data = composite_state(self.state_bytes(seq), sources, positions)
        except ValueError as error:
            raise SettingsError(f"this model's KV cache cannot keep tokens per head: {error}", "use `heads` sum") from error
        self.remove(seq, -1, -1)
        self.load_state(data, seq)
        return cell_positions(data)

    def positions(self, seq: int = 0) -> np.ndarray:
        """Positions of the sequence's cells, in cell order (parsed from the state's header)."""
        return cell_positions(self.state_bytes(seq))

    def close(self) -> None:
        if self._ctx:
            raw.llama_batch_free(self._batch)
            raw.llama_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> "LlamaContext":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
