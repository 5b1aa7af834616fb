"""A synthetic llama-shaped F16 GGUF for the benchmarks: the shapes and hparams llama.cpp's loader
reads, N(0, 0.02^2) weights drawn once as a 4 Mi-value block and tiled (no quantizer's work depends
on repeats), written tensor by tensor with gguf.GGUFWriter so memory stays small."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def synth_llama(path: Path, n_layer: int, n_embd: int = 2048, n_ff: int = 8192, n_vocab: int = 0,
                n_head: int = 32, seed: int = 0) -> tuple[int, int]:
    """Writes the model (a tied token_embd when n_vocab > 0); returns (model bytes, largest tensor bytes)."""
    w = GGUFWriter(path, "llama")
    w.add_name(f"synth-llama-{n_layer}x{n_embd}")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(130000.0)
    w.add_file_type(1)  # MOSTLY_F16
    shapes: dict[str, tuple[int, ...]] = {}
    if n_vocab:
        w.add_vocab_size(n_vocab)
        shapes["token_embd.weight"] = (n_vocab, n_embd)
    shapes["output_norm.weight"] = (n_embd,)
    for i in range(n_layer):
        shapes[f"blk.{i}.attn_norm.weight"] = (n_embd,)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes[f"blk.{i}.{n}.weight"] = (n_embd, n_embd)
        shapes[f"blk.{i}.ffn_norm.weight"] = (n_embd,)
        shapes[f"blk.{i}.ffn_gate.weight"] = (n_ff, n_embd)
        shapes[f"blk.{i}.ffn_up.weight"] = (n_ff, n_embd)
        shapes[f"blk.{i}.ffn_down.weight"] = (n_embd, n_ff)
    for name, shape in shapes.items():
        dt = np.dtype(np.float32 if len(shape) == 1 else np.float16)
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    block = (np.random.default_rng(seed).standard_normal(1 << 22) * 0.02).astype(np.float16)
    for shape in shapes.values():
        n = int(np.prod(shape))
        w.write_tensor_data((np.ones(n, np.float32) if len(shape) == 1 else np.resize(block, n)).reshape(shape))
    w.close()
    sizes = [int(np.prod(s)) * (4 if len(s) == 1 else 2) for s in shapes.values()]
    return sum(sizes), max(sizes)
