"""Write a tiny random-weight qwen2 GGUF for mechanics tests.

The model is meaningless (random weights) but it runs through exactly the code paths of a real
model: the qwen2 graph, a byte-level BPE vocabulary with ChatML control tokens and an embedded
chat template. Tests assert shapes, counts, positions and logit equivalences on it, never text.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_FF = 128
CONTEXT_LENGTH = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "i n", "Ġt he", "e r", "a n"]


def _byte_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character table (the byte-level BPE alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int]]:
    """Tokens and their llama.cpp token types: 256 bytes, merge results, then control tokens."""
    tokens = _byte_to_unicode() + [m.replace(" ", "") for m in MERGES]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += SPECIAL_TOKENS
    types += [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    return tokens, [int(t) for t in types]


def _add_tokenizer(writer: gguf.GGUFWriter, chat_template: str | bytes) -> None:
    tokens, types = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_key_value(gguf.Keys.Tokenizer.CHAT_TEMPLATE, chat_template, gguf.GGUFValueType.STRING)  # bytes: as written


def _add_tensors(writer: gguf.GGUFWriter, n_vocab: int, rng: np.random.Generator, n_embd: int) -> None:
    head_dim = n_embd // N_HEAD
    kv_dim = N_HEAD_KV * head_dim

    def weight(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd, 1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd, 0.2))
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(n_embd, n_embd, 0.3))
        writer.add_tensor(f"{prefix}.attn_q.bias", np.zeros(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(kv_dim, n_embd, 0.3))
        writer.add_tensor(f"{prefix}.attn_k.bias", np.zeros(kv_dim, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(kv_dim, n_embd))
        writer.add_tensor(f"{prefix}.attn_v.bias", np.zeros(kv_dim, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(N_FF, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(N_FF, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(n_embd, N_FF))


def write_tiny_gguf(
    path: Path, seed: int = 0, context_length: int = CONTEXT_LENGTH, n_embd: int = N_EMBD, chat_template: str | bytes = CHATML_TEMPLATE,
    extra: dict[str, int] | None = None,
) -> Path:
    """Write the tiny model to `path` and return it; `n_embd` 128 gives heads 32 wide, which a
    q8_0 block (32 values) fits; `chat_template` as bytes is written as they are (not UTF-8, say).
    `extra`: more metadata, each a uint32 (`qwen2.attention.key_length`)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("kvchat-tiny-random")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    _add_tokenizer(writer, chat_template)
    n_vocab = len(vocabulary()[0])
    _add_tensors(writer, n_vocab, rng, n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
