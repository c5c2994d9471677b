"""Tiny LoRA adapters for the tiny models (a helper module, not a test module).

`random_pairs` draws an adapter's A [rank, in] and B [out, rank] for some of a tiny model's
tensors; `write_adapter` writes them as llama.cpp's convert_lora_to_gguf.py does (general.type
"adapter", adapter.type "lora", adapter.lora.alpha, `<name>.lora_a` / `<name>.lora_b`);
`merge` gives the weights with the deltas merged in, W + scale * alpha / rank * B A: the model a
LoRA-serving forward must equal (write it with `write_tiny_gguf(..., transform=merge(...))`).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def random_pairs(weights: dict[str, np.ndarray], names: list[str], rank: int = 4,
                 seed: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{tensor name: (A, B)} with deltas about as large as the weights (B A ~ W in scale)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in names:
        n_out, n_in = weights[name].shape
        a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * 0.5 / np.sqrt(rank)).astype(np.float32)
        out[name] = (a, b)
    return out


def layer_names(n_layers: int, targets=TARGETS, output: bool = False) -> list[str]:
    names = [f"blk.{i}.{t}.weight" for i in range(n_layers) for t in targets]
    return names + (["output.weight"] if output else [])


def write_adapter(path: str | Path, arch: str, pairs: dict[str, tuple[np.ndarray, np.ndarray]],
                  alpha: float = 0.0, **extra) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for key, value in extra.items():
        writer.add_string(key, value)
    for name, (a, b) in pairs.items():
        writer.add_tensor(name + ".lora_a", a)
        writer.add_tensor(name + ".lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def merge(pairs: dict[str, tuple[np.ndarray, np.ndarray]], scale: float, alpha: float = 0.0):
    """A write_tiny_gguf `transform`: each paired weight plus scale * (alpha / rank or 1) * B A."""
    def transform(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(weights)
        for name, (a, b) in pairs.items():
            f = alpha / a.shape[0] if alpha else 1.0
            out[name] = (weights[name].astype(np.float64) + scale * f * (b.astype(np.float64) @ a)).astype(np.float32)
        return out
    return transform
