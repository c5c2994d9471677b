"""An independent BERT forward and WordPiece tokenizer straight from a GGUF file (test oracles, not product code).

The forward reads tensors with `gguf.GGUFReader` + `gguf.quants.dequantize` and runs llama.cpp's
`build_bert` one sequence at a time in float64: no padding, no masks, no fused q|k|v. GELU is ggml's
CPU GELU: a table of 65536 float16 results of the tanh formula, indexed by the input's float16 bits
(built here from numpy's float16, apart from the product's torch rounding).

The tokenizer is llama.cpp's `llm_tokenizer_wpm_session` transcribed: code points, NFD and accent
marks dropped when lowercasing, whitespace splits, punctuation / ASCII symbols / CJK ideographs are
words of their own, then each `▁word` is matched greedily, longest vocabulary entry first.
"""

from __future__ import annotations

import math
import unicodedata

import numpy as np
import torch

from llama_reference import read_gguf  # noqa: F401  (re-exported for the embedding tests)


def _gelu_table() -> np.ndarray:
    x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        y = 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * x * (1.0 + np.float32(0.044715) * x * x)))
    return y.astype(np.float16).astype(np.float64)


GELU_TABLE = _gelu_table()


def ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    bits = x.float().numpy().astype(np.float16).view(np.uint16)
    y = torch.from_numpy(GELU_TABLE[bits])
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def bert_hidden(path, tokens: list[int]) -> torch.Tensor:
    """Final hidden states `[len(tokens), d]` (float64) of one sequence."""
    md, w = read_gguf(path)
    nh, eps = md["bert.attention.head_count"], md["bert.attention.layer_norm_epsilon"]
    n, d = len(tokens), md["bert.embedding_length"]
    hd = d // nh

    def ln(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    x = w["token_embd.weight"][tokens] + w["token_types.weight"][0] + w["position_embd.weight"][:n]
    x = ln(x, "token_embd_norm")
    for i in range(md["bert.block_count"]):
        p = f"blk.{i}."
        q, k, v = (lin(x, p + f"attn_{c}").view(n, nh, hd) for c in "qkv")
        att = (torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)).softmax(-1)
        x = ln(lin(torch.einsum("hqk,khd->qhd", att, v).reshape(n, d), p + "attn_output") + x, p + "attn_output_norm")
        x = ln(lin(ggml_gelu(lin(x, p + "ffn_up")), p + "ffn_down") + x, p + "layer_output_norm")
    return x


def rank_scores(path, tokens: list[int]) -> torch.Tensor:
    """The classification head on the first token: tanh(cls) if present, then cls.output."""
    _, w = read_gguf(path)
    h = bert_hidden(path, tokens)[0]
    if "cls.weight" in w:
        h = torch.tanh(h @ w["cls.weight"].T + w["cls.bias"])
    return h @ w["cls.output.weight"].T + w["cls.output.bias"]


def wpm_tokenize(md: dict, text: str, add_special: bool = True) -> list[int]:
    """llama.cpp's WPM tokenizer (no special-token parsing)."""
    tokens = md["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    lower = bool(md.get("tokenizer.ggml.normalizer.lowercase", False))
    ids = [md["tokenizer.ggml.bos_token_id"]] if add_special else []
    for word in _words(text, lower):
        word, start, pieces = "▁" + word, 0, []
        while start < len(word):
            end = next((e for e in range(len(word), start, -1) if word[start:e] in vocab), None)
            if end is None:
                pieces = [md["tokenizer.ggml.unknown_token_id"]]
                break
            pieces.append(vocab[word[start:end]])
            start = end
        ids += pieces
    return ids + ([md["tokenizer.ggml.seperator_token_id"]] if add_special else [])


def _words(text: str, lower: bool) -> list[str]:
    if lower:
        text = unicodedata.normalize("NFD", text)
    words, cur = [], ""
    for ch in text:
        cat = unicodedata.category(ch)
        if ch.isspace():
            words, cur = words + [cur] if cur else words, ""
        elif ch in ("\0", "\ufffd") or cat.startswith("C") or (lower and cat == "Mn"):
            continue
        elif cat.startswith("P") or (ord(ch) < 0x7F and cat.startswith("S")) or 0x4E00 <= ord(ch) <= 0x9FFF:
            words, cur = words + ([cur] if cur else []) + [ch.lower() if lower else ch], ""
        else:
            cur += ch.lower() if lower else ch
    return words + ([cur] if cur else [])
