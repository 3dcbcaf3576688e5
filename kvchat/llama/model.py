"""A loaded GGUF model: shape, vocabulary, tokenizer and chat template."""

from __future__ import annotations

import codecs
import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvchat.errors import ModelError, PromptTooLongError
from kvchat.llama._lib import backend_ready, raw
from kvchat.llama.cpu import apply_weight_layout, weight_buffers, weight_layout
from kvchat.llama.logs import captured_lines, route_logs
from kvchat.llama.shape_limits import checked

# Bytes per element of the KV cache types kvchat offers (ggml_type ids).
CACHE_TYPE_BYTES = {"f16": (1, 2.0), "q8_0": (8, 34 / 32), "f32": (0, 4.0)}  # ggml type id, bytes per element
CACHE_TYPE_BLOCK = {"f16": 1, "q8_0": 32, "f32": 1}  # values per block (gguf's GGML_QUANT_SIZES)
CACHE_TYPES = tuple(CACHE_TYPE_BYTES)
LOAD_ERROR = "error loading model: "  # llama.cpp's log line that says why a model did not load


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int
    n_vocab: int

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> int:
        """K and V of every layer for one token: layers x kv_heads x head_dim x (K + V bytes)."""
        element_bytes = CACHE_TYPE_BYTES[type_k][1] + CACHE_TYPE_BYTES[type_v][1]
        return int(self.n_layer * self.n_head_kv * self.head_dim * element_bytes)


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (CUDA, Metal, Vulkan…); a CPU-only
    build ignores n_gpu_layers without a word."""
    backend_ready()
    return bool(raw.llama_supports_gpu_offload())


def _load_error(path: Path, load_log: list[str], gpu_layers: int) -> ModelError:
    """llama.cpp's own reason, from its log ("error loading model: …"): a file cut short, an
    architecture it does not know, a GPU buffer it could not allocate."""
    reasons = [line.split(LOAD_ERROR, 1)[1] for line in load_log if LOAD_ERROR in line]
    message = f"{path}: llama.cpp could not load this model" + (f": {reasons[-1]}" if reasons else "")
    if gpu_layers > 0:
        return ModelError(message, "is it a complete GGUF file, and do its `gpu_layers` fit the GPU's free memory?")
    return ModelError(message, "is it a complete GGUF file?")


class LlamaModel:
    """Owns a `llama_model`; free it with close() (or use as a context manager)."""

    def __init__(self, path: Path, gpu_layers: int = 0) -> None:
        route_logs()
        backend_ready()
        params = raw.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        self.gpu_layers = gpu_layers
        self.weight_layout = weight_layout()
        apply_weight_layout(params, self.weight_layout)
        self.path = Path(path)
        with captured_lines() as load_log:
            self._model = raw.llama_model_load_from_file(str(self.path).encode(), params)
        # MiB of weights per buffer type llama.cpp chose (CPU_Mapped, CPU_REPACK, CUDA0, ...).
        self.weight_buffers = weight_buffers(load_log)
        if not self._model:
            raise _load_error(self.path, load_log, gpu_layers)
        self._vocab = raw.llama_model_get_vocab(self._model)
        self._piece_texts: dict[int, str] = {}
        self._piece_lengths: dict[int, int] = {}
        try:
            self.shape = self._read_shape()
            self.chat_template = self._read_chat_template()
        except ModelError:
            self.close()  # refused: its weights are freed now, not when the process ends
            raise

    def _read_shape(self) -> ModelShape:
        """The model's shape, each value within SHAPE_LIMITS (shape_limits.py) before any context is made."""
        n_head = self._sized("attention.head_count", raw.llama_model_n_head(self._model))
        n_embd = self._sized("embedding_length", raw.llama_model_n_embd(self._model))
        key_length = self._sized("attention.key_length", n_embd // n_head)
        self._sized("attention.value_length", key_length)
        return ModelShape(
            n_layer=self._sized("block_count", raw.llama_model_n_layer(self._model)),
            n_head=n_head,
            n_head_kv=self._sized("attention.head_count_kv", raw.llama_model_n_head_kv(self._model)),
            head_dim=key_length,
            n_ctx_train=self._sized("context_length", raw.llama_model_n_ctx_train(self._model)),
            n_vocab=raw.llama_vocab_n_tokens(self._vocab),
        )

    def _sized(self, name: str, known: int) -> int:
        """Shape `name` as the file says it (`known`, what llama.cpp read, where the file says it as
        a list, per layer, or not at all), refused when out of bounds."""
        architecture = self.metadata("general.architecture") or "general"
        said = self.metadata(f"{architecture}.{name}")
        return checked(self.path, architecture, name, int(said) if said is not None and said.isdigit() else known)

    def _read_chat_template(self) -> str:
        """The template as text; one that is not UTF-8 refuses the model, naming its key (llama.cpp
        would render its bytes into every prompt)."""
        template = raw.llama_model_chat_template(self._model, None)
        if not template:
            raise ModelError(f"{self.path}: the model has no chat template", "use an instruct/chat GGUF")
        try:
            return template.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ModelError(f"{self.path}: its chat template (tokenizer.chat_template) is not UTF-8 (byte {error.start:,})",
                             "use another GGUF of the model: this one was written damaged") from None

    @property
    def on_gpu(self) -> bool:
        """Whether every layer runs on a GPU: a GPU build given at least the model's layers."""
        return self.gpu_layers >= self.shape.n_layer and gpu_offload_supported()

    @property
    def handle(self) -> object:
        return self._model

    def metadata(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(512)
        length = raw.llama_model_meta_val_str(self._model, key.encode(), buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace") if length >= 0 else None

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Tokens of `text` as plain text: `<|im_end|>` written in a document stays words.
        `special=True` parses control-token strings into control tokens: only for text the
        chat template itself wrote, never for a document, a question or an API message."""
        data = text.encode("utf-8")
        capacity = len(data) + 16
        tokens = (raw.llama_token * capacity)()
        count = raw.llama_tokenize(self._vocab, data, len(data), tokens, capacity, False, special)
        if count < 0:
            capacity = -count
            tokens = (raw.llama_token * capacity)()
            count = raw.llama_tokenize(self._vocab, data, len(data), tokens, capacity, False, special)
        if count < 0:
            raise PromptTooLongError("the text is too long to tokenize", "use a shorter document")
        return tokens[:count]  # a new list

    def count_tokens(self, text: str) -> int:
        """How many tokens tokenize(text) returns, without building them in Python: a 16M-token
        document's list takes ~600 MB for a moment (its size is all an upload needs)."""
        data = text.encode("utf-8")
        count = raw.llama_tokenize(self._vocab, data, len(data), None, 0, False, False)
        return -count if count < 0 else count

    def piece(self, token: int, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character)."""
        buffer = ctypes.create_string_buffer(64)
        length = raw.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = raw.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        return buffer.raw[: max(length, 0)]

    def pieces_text(self, tokens: list[int]) -> list[str]:
        """Each token's text on its own (for span detection), invalid UTF-8 replaced.

        Remembered per token id: every selection asks again for the whole document's pieces.
        """
        texts = self._piece_texts
        for token in tokens:
            if token not in texts:
                texts[token] = self.piece(token).decode("utf-8", errors="replace")
        return [texts[token] for token in tokens]

    def piece_lengths(self, tokens: list[int]) -> np.ndarray:
        """Each token's length in bytes as it appears in a rendered prompt (special tokens too)."""
        lengths = self._piece_lengths
        for token in tokens:
            if token not in lengths:
                lengths[token] = len(self.piece(token, special=True))
        return np.fromiter((lengths[token] for token in tokens), dtype=np.int64, count=len(tokens))

    def same_vocabulary(self, other: "LlamaModel") -> bool:
        """Whether `other` has exactly these tokens (every piece, control tokens too), so that a
        prompt tokenized by one is the same prompt to the other."""
        count = self.shape.n_vocab
        if count != other.shape.n_vocab:
            return False
        return all(self.piece(token, special=True) == other.piece(token, special=True) for token in range(count))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(raw.llama_vocab_is_eog(self._vocab, token))

    def apply_chat_template(self, messages: list[dict[str, str]], add_assistant: bool = True) -> str:
        """Render `messages` with the model's own chat template (llama.cpp's template engine)."""
        array = (raw.llama_chat_message * len(messages))()
        encoded = [(m["role"].encode(), m["content"].encode()) for m in messages]
        for slot, (role, content) in zip(array, encoded):
            slot.role, slot.content = role, content
        template = self.chat_template.encode()
        capacity = sum(len(c) + len(r) for r, c in encoded) * 2 + 256
        buffer = ctypes.create_string_buffer(capacity)
        length = raw.llama_chat_apply_template(template, array, len(messages), add_assistant, buffer, capacity)
        if length > capacity:
            buffer = ctypes.create_string_buffer(length)
            length = raw.llama_chat_apply_template(template, array, len(messages), add_assistant, buffer, length)
        if length < 0:
            raise ModelError(f"{self.path}: llama.cpp does not support this model's chat template", "use another GGUF")
        return buffer.raw[:length].decode("utf-8")

    def close(self) -> None:
        if self._model:
            raw.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Detokenizer:
    """Turns a stream of tokens into text, never splitting a UTF-8 character across events."""

    def __init__(self, model: LlamaModel) -> None:
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._model.piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
