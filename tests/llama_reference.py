"""An independent, naive llama forward straight from a GGUF file (a test oracle, not product code).

Reads tensors with `gguf.GGUFReader` + `gguf.quants.dequantize`, keeps the file's own q/k layout,
applies rope in the mode the architecture's GGUF weights expect (normal: adjacent pairs; neox: half
split), and computes full causal attention over one whole sequence in float64.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

NEOX_ARCHS = {"qwen2"}


def read_gguf(path) -> tuple[dict, dict]:
    """(metadata, every tensor dequantized to float64 in its natural shape) by gguf-py alone."""
    r = gguf.GGUFReader(path)
    md = {k: f.contents() for k, f in r.fields.items()}
    ts = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        ts[t.name] = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))).double().reshape(shape)
    return md, ts


def _rope(x: torch.Tensor, base: float, neox: bool) -> torch.Tensor:
    """x: [tokens, heads, hd] at positions 0..tokens-1."""
    n, _, hd = x.shape
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)[:, None, :]   # [n, 1, hd/2]
    c, s = ang.cos(), ang.sin()
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def llama_logits(path, tokens: list[int]) -> torch.Tensor:
    """Logits `[len(tokens), vocab]` of the model in `path` for one sequence."""
    md, w = read_gguf(path)
    arch = md["general.architecture"]
    nh, nkv = md[f"{arch}.attention.head_count"], md[f"{arch}.attention.head_count_kv"]
    eps, base = md[f"{arch}.attention.layer_norm_rms_epsilon"], md[f"{arch}.rope.freq_base"]
    d = md[f"{arch}.embedding_length"]
    hd, n = d // nh, len(tokens)

    def norm(x, wt):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * wt

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["token_embd.weight"][tokens]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for i in range(md[f"{arch}.block_count"]):
        p = f"blk.{i}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = _rope(lin(h, p + "attn_q").view(n, nh, hd), base, arch in NEOX_ARCHS)
        k = _rope(lin(h, p + "attn_k").view(n, nkv, hd), base, arch in NEOX_ARCHS)
        v = lin(h, p + "attn_v").view(n, nkv, hd)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + lin(torch.einsum("hqk,khd->qhd", att, v).reshape(n, d), p + "attn_output")
        h = norm(x, w[p + "ffn_norm.weight"])
        g = lin(h, p + "ffn_gate")
        x = x + lin(g * torch.sigmoid(g) * lin(h, p + "ffn_up"), p + "ffn_down")
    out = w.get("output.weight", w["token_embd.weight"])
    return norm(x, w["output_norm.weight"]) @ out.T
