"""LoRA adapters (llama.cpp's `--lora`): low-rank deltas on a model's matmuls, each adapter with a
scale that the server sets (`POST /lora-adapters`) and each request may override (`lora`).

A matmul with adapters computes what llama.cpp's `build_lora_mm` does:

    y = x W^T + sum_a s_a * f_a * (x A_a^T) B_a^T,    f_a = alpha_a / rank where the file has an alpha, else 1

Files are llama.cpp's adapter GGUFs (convert_lora_to_gguf.py): `general.type` "adapter",
`adapter.type` "lora", `adapter.lora.alpha`, and for each adapted tensor `<name>.lora_a`
[rank, in] and `<name>.lora_b` [out, rank] (numpy order). Validated as llama.cpp validates them
(the architecture, the pairs, the shapes), and more: a tensor this model has no matmul for, an
aLoRA, or a mixture-of-experts FFN is refused by name at load rather than ignored.

**Per row, not per step.** llama-server never batches two slots whose adapters differ. Here each
row of a step carries its request's scales (`Batch.lora`, [rows, adapters]), so requests with
different adapters share the step. Every adapter touching a matmul is stacked into one [R, in] A
and one [out, R] B (B placed in the output columns its tensor feeds: q, k, v in q|k|v, gate and up
in gate|up, with the weights' neox row order), so a matmul's deltas for every adapter and row are
two small matmuls: ((x A^T) * (scales[:, adapter of each rank] * f)) B^T, in float32.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from slotserver.model import lora_delta
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.spec import ModelSpec
from slotserver.model.weights import _neox_to_normal, _qkv_rows

_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")


class LoraError(ValueError):
    """An adapter file that cannot serve this model; the message names the file and the problem."""


@dataclass
class LoraAdapter:
    path: Path
    alpha: float
    task_name: str = ""
    prompt_prefix: str = ""
    # target -> [(A [rank, in], B [rows, rank])], float32, B's rows in the weights' order
    pairs: dict[tuple[int, str], list[tuple[int, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    identity: str = ""   # the file's size, mtime and path hashed: what a cached KV was computed with

    def factor(self, rank: int) -> float:
        """llama.cpp's get_scale without the adapter scale: alpha / rank, or 1 without an alpha."""
        return self.alpha / rank if self.alpha else 1.0


def read_adapter(path: str | Path, spec: ModelSpec, arch: str) -> LoraAdapter:
    """Load and check one adapter file for a model of `spec` (its GGUF architecture `arch`)."""
    path = Path(path)
    try:
        f = GGUFFile.open(path)
    except (OSError, ValueError) as e:
        raise LoraError(f"LoRA adapter {path}: {e}") from None
    meta = f.metadata
    for key, want in (("general.type", "adapter"), ("general.architecture", arch), ("adapter.type", "lora")):
        if meta.get(key) != want:
            raise LoraError(f"LoRA adapter {path}: {key} is {meta.get(key)!r}, expected {want!r}")
    if "adapter.alora.invocation_tokens" in meta:
        raise LoraError(f"LoRA adapter {path}: activated LoRA (aLoRA) adapters are not supported")
    ad = LoraAdapter(path, float(meta.get("adapter.lora.alpha", 0.0) or 0.0),
                     str(meta.get("adapter.lora.task_name", "")), str(meta.get("adapter.lora.prompt_prefix", "")))
    st = path.stat()
    ad.identity = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    names = sorted({n.removesuffix(".lora_a").removesuffix(".lora_b") for n in f.tensors})
    for base in names:
        if base + ".lora_a" not in f.tensors or base + ".lora_b" not in f.tensors:
            raise LoraError(f"LoRA adapter {path}: {base} lacks its lora_a or lora_b tensor")
        key, offset, rows, cols = _target(base, spec, path)
        a, b = f.load_tensor(base + ".lora_a"), f.load_tensor(base + ".lora_b")   # [rank, in], [out, rank]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != cols or b.shape[0] != rows or a.shape[0] != b.shape[1]:
            raise LoraError(f"LoRA adapter {path}: {base} has lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)}, "
                            f"expected [rank, {cols}] and [{rows}, rank] (numpy order)")
        ad.pairs.setdefault(key, []).append((offset, a, _reorder(b, base, spec)))
    if not ad.pairs:
        raise LoraError(f"LoRA adapter {path}: no lora_a/lora_b tensors")
    return ad


def _target(base: str, spec: ModelSpec, path: Path) -> tuple[tuple[int, str], int, int, int]:
    """Where a GGUF tensor's delta goes: the model's matmul ((layer, "qkv" | "wo" | "gate_up" | "down"),
    or (-1, "output")), the first output column it feeds (q, k, v share q|k|v), its rows (outputs)
    and its columns (inputs)."""
    d, hd = spec.d_model, spec.head_dim
    q, kv, ff = spec.n_heads * hd, spec.n_kv_heads * hd, spec.d_ff
    if spec.recurrent is not None:   # its layers' q|k|v rows are not attention's (gated q, in-projections)
        raise LoraError(f"LoRA adapter {path}: adapters on a hybrid model ({spec.arch}) are not supported")
    if spec.mla is not None:   # q_a|kv_a, q_b and the latent's own widths: no q|k|v (mla_layer.py)
        raise LoraError(f"LoRA adapter {path}: adapters on a latent-attention model ({spec.arch}) are not supported")
    if base == "output.weight":   # a tied model has none (llama.cpp: "tensor not found in base model")
        if spec.tied_embeddings:
            raise LoraError(f"LoRA adapter {path}: {base}: this model has no output matmul of its own "
                            "(it is tied to token_embd)")
        return (-1, "output"), 0, spec.vocab_size, d
    m = _LAYER.match(base)
    if m is None or int(m.group(1)) >= spec.n_layers:
        raise LoraError(f"LoRA adapter {path}: {base} is no matmul of this model that an adapter can change")
    i, name = int(m.group(1)), m.group(2)
    ffn = name.startswith("ffn_")
    if ffn and spec.moe is not None:
        raise LoraError(f"LoRA adapter {path}: {base}: adapters on a mixture-of-experts FFN are not supported")
    ungated = spec.act == "relu2"   # arcee: gate_up holds the up rows alone
    table = {"attn_q": ("qkv", 0, q, d), "attn_k": ("qkv", q, kv, d), "attn_v": ("qkv", q + kv, kv, d),
             "attn_qkv": ("qkv", 0, q + 2 * kv, d), "attn_output": ("wo", 0, d, q),
             "ffn_gate": ("gate_up", 0, ff, d), "ffn_down": ("down", 0, d, ff),
             "ffn_up": ("gate_up", 0 if spec.fused or ungated else ff, 2 * ff if spec.fused else ff, d)}
    qkv_part = name in ("attn_q", "attn_k", "attn_v", "attn_qkv")
    if name not in table or (name == "ffn_gate" and (spec.fused or ungated)) \
            or (qkv_part and (name == "attn_qkv") != spec.fused):
        raise LoraError(f"LoRA adapter {path}: {base} is no matmul of this model that an adapter can change")
    linear, offset, rows, cols = table[name]
    return (i, linear), offset, rows, cols


def _reorder(b: torch.Tensor, base: str, spec: ModelSpec) -> torch.Tensor:
    """B's rows in the order the weights keep theirs: neox-rope q and k heads as adjacent pairs
    (weights.py), so the delta lands on the rows its weight's outputs moved to."""
    if spec.rope_mode != "neox":
        return b
    if base.endswith("attn_q.weight") or base.endswith("attn_k.weight"):
        return _neox_to_normal(b, spec)
    if base.endswith("attn_qkv.weight"):
        return b[_qkv_rows(spec)]
    return b


@dataclass
class _Packed:
    a: torch.Tensor        # [R, in] float32: every adapter's A stacked
    bt: torch.Tensor       # [R, out] float32: each B (transposed) in its output columns, zero elsewhere
    adapter: torch.Tensor  # [R] int64: the adapter of each rank
    factor: torch.Tensor   # [R] float32: its alpha / rank


class LoraSet:
    """The server's adapters, packed per matmul for `delta`. Index i of a scales vector is adapter i
    (the order of `--lora` / `--lora-scaled`, llama-server's ids)."""

    def __init__(self, adapters: list[LoraAdapter], spec: ModelSpec, device: str | torch.device = "cpu") -> None:
        self.adapters = adapters
        outs = {"qkv": (spec.n_heads + 2 * spec.n_kv_heads) * spec.head_dim, "wo": spec.d_model,
                "gate_up": (1 if spec.act == "relu2" else 2) * spec.d_ff, "down": spec.d_model, "output": spec.vocab_size}
        self._packed: dict[tuple[int, str], _Packed] = {}
        keys = sorted({k for ad in adapters for k in ad.pairs})
        for key in keys:
            parts = [(i, ad, off, a, b) for i, ad in enumerate(adapters) for off, a, b in ad.pairs.get(key, [])]
            self._packed[key] = _pack(parts, outs[key[1]], device)

    def delta(self, key: tuple[int, str], x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
        """x [rows, in], scales [rows, adapters] float32 -> the float32 [rows, out] to add to the
        matmul `key`'s output; None where no adapter touches it."""
        p = self._packed.get(key)
        if p is None:
            return None
        u = x.float() @ p.a.T                            # [rows, R]
        u.mul_(scales[:, p.adapter] * p.factor)
        return u @ p.bt                                  # [rows, out]

    def add(self, key: tuple[int, str], x: torch.Tensor, y: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """y (= x W^T, any float dtype) with the adapters' delta added in float32, in y's dtype."""
        d = self.delta(key, x, scales)
        return y if d is None else (y.float() + d).to(y.dtype)

    def add_from(self, key: tuple[int, str], x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, ops,
                 norm: torch.Tensor | None, eps: float, glu: bool) -> torch.Tensor:
        """out (the matmul's output, or the residual it was added into) += the delta of the matmul
        whose input is x normed (`norm`) or gated (`glu`) as the fused matmul computes it; in place
        in one C call where lora_delta applies (a step graph replays it), else with torch."""
        p = self._packed.get(key)
        if p is None:
            return out
        if lora_delta.applies(x, out, norm):
            return lora_delta.add_delta(p, x, out, scales, norm, eps, glu)
        h = ops.silu_mul(x) if glu else ops.rms_norm(x, norm, eps) if norm is not None else x
        return out.add_(self.delta(key, h, scales).to(out.dtype))


def _pack(parts: list, out: int, device) -> _Packed:
    """Stack (adapter index, adapter, row offset, A, B) parts of one matmul."""
    ranks = [a.shape[0] for _, _, _, a, _ in parts]
    b_all = torch.zeros(out, sum(ranks))
    col = 0
    for (_, _, off, _, b), r in zip(parts, ranks):
        b_all[off: off + b.shape[0], col: col + r] = b
        col += r
    adapter = torch.tensor([i for (i, *_), r in zip(parts, ranks) for _ in range(r)], dtype=torch.int64)
    factor = torch.tensor([ad.factor(r) for (_, ad, *_), r in zip(parts, ranks) for _ in range(r)])
    a_all = torch.cat([a for *_, a, _ in parts])
    return _Packed(*(t.to(device) for t in (a_all, b_all.T.contiguous(), adapter, factor)))
