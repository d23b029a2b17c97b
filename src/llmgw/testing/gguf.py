"""A tiny, deterministic GGUF model for running a real llama.cpp server in tests.

:func:`write_tiny_gguf` writes a llama-architecture model of random F32 weights
(seeded): 2 blocks, hidden size 64, 4 heads of 16, FFN 128, context 4096, a GPT-2
byte-level BPE vocabulary (the 256 byte tokens, a few merges -- llama.cpp refuses a
``gpt2`` vocabulary without merges -- and ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``) and a ChatML chat template. About 470 KB; llama.cpp loads it in
tens of milliseconds and generates thousands of tokens a second on one core.

Its output is random bytes. Pass ``seed`` in a request for reproducible text and
``ignore_eos: true`` when a test needs exactly ``max_tokens`` tokens.

Needs the ``gguf`` and ``numpy`` packages (the ``dev`` extra), imported on call so
that importing this module costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CHATML_TEMPLATE", "TINY_CONTEXT", "write_tiny_gguf"]

TINY_CONTEXT = 4096
_BLOCKS = 2
_HIDDEN = 64
_HEADS = 4
_FFN = 128
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Pairs of byte-level symbols (GPT-2's "Ġ" is the space byte); each merge's result is
# a token of its own.
_MERGES = (("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("Ġt", "he"))

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (``bytes_to_unicode``), in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = 0
    symbols: list[str] = []
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def write_tiny_gguf(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny model to `path` (same `seed`, same bytes) and return the path."""
    import gguf
    import numpy as np

    path = Path(path)
    tokens = _byte_symbols()
    merges = []
    for left, right in _MERGES:
        merges.append(f"{left} {right}")
        tokens.append(left + right)
    normal = len(tokens)
    tokens += _SPECIALS
    types = [gguf.TokenType.NORMAL] * normal + [gguf.TokenType.CONTROL] * len(_SPECIALS)
    vocab = len(tokens)
    endoftext, _im_start, im_end = (tokens.index(s) for s in _SPECIALS)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("llmgw-tiny")
    w.add_block_count(_BLOCKS)
    w.add_context_length(TINY_CONTEXT)
    w.add_embedding_length(_HIDDEN)
    w.add_feed_forward_length(_FFN)
    w.add_head_count(_HEADS)
    w.add_head_count_kv(_HEADS)
    w.add_rope_dimension_count(_HIDDEN // _HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(endoftext)
    w.add_eos_token_id(im_end)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        # numpy (rows, cols) is GGUF (cols, rows): the input size first.
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", weight(vocab, _HIDDEN))
    for i in range(_BLOCKS):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", ones(_HIDDEN))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"{b}.{name}.weight", weight(_HIDDEN, _HIDDEN))
        w.add_tensor(f"{b}.ffn_norm.weight", ones(_HIDDEN))
        w.add_tensor(f"{b}.ffn_gate.weight", weight(_FFN, _HIDDEN))
        w.add_tensor(f"{b}.ffn_up.weight", weight(_FFN, _HIDDEN))
        w.add_tensor(f"{b}.ffn_down.weight", weight(_HIDDEN, _FFN))
    w.add_tensor("output_norm.weight", ones(_HIDDEN))
    w.add_tensor("output.weight", weight(vocab, _HIDDEN))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
