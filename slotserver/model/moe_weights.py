"""Load one layer's mixture-of-experts weights (`MoeWeights`, moe.py) from a GGUF file.

The 3-D expert tensors stay GGUF blocks (`Experts`, views of the file's mapping, computed on by
kernels/moe_matmul.py) under `--weights q` (the default); under `dense` (float32's exact
reference mode) they are dequantized into float `Experts` of the compute dtype, computed on by the
same kernel's torch grouping. The dequantized int8/int4 formats have no expert form: a MoE file
asked for them is refused in one line. The router (`ffn_gate_inp`, llama-quantize keeps it F32)
and qwen2moe's shared-expert gate are small and kept dense (the router in float64: moe.py's router_logits),
as is lfm2moe's selection bias (`exp_probs_b`).
"""

from __future__ import annotations

import torch

from slotserver.errors import GGUFError
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.moe import MoeWeights
from slotserver.model.spec import ModelSpec
from slotserver.runtime.experts import Experts
from slotserver.runtime.qblocks import QWeight, T, from_mapped

EXPERT_KINDS = ("q", "dense")
_FLOAT_TYPES = {torch.float32: T.F32, torch.bfloat16: T.BF16, torch.float16: T.F16}


def load_moe(f: GGUFFile, spec: ModelSpec, p: str, kind: str, dtype: torch.dtype) -> MoeWeights:
    """Layer `p` ("blk.{i}.")'s router and experts; kind: the resolved weight kind (q or dense)."""
    if kind not in EXPERT_KINDS:
        raise GGUFError(f.path, f"a {spec.arch} mixture-of-experts model runs its experts on the GGUF blocks or "
                                f"dequantized (--weights auto, q or dense), not --weights {kind}")
    moe, d = spec.moe, spec.d_model
    e, ff = moe.n_expert, moe.d_ff
    f.require(p + "ffn_gate_inp.weight", (e, d))
    router = f.load_tensor(p + "ffn_gate_inp.weight", torch.float32).double()           # [E, d_model]
    names = ("ffn_up_exps.weight",) if moe.act == "relu2" else ("ffn_gate_exps.weight", "ffn_up_exps.weight")
    dx = moe.latent or d                       # the experts' width (Nemotron 3 Super: its latent space)
    rows = [expert_rows(f, p + n, (e, ff, dx), kind, dtype) for n in names]   # no gate: nemotron_h_moe's
    down = expert_rows(f, p + "ffn_down_exps.weight", (e, dx, ff), kind, dtype)
    gate_up = [Experts(tuple(rows), e)] if len({r.qtype for r in rows}) == 1 else [Experts((r,), e) for r in rows]
    shared_gate = None
    if moe.d_ff_shared and p + "ffn_gate_inp_shexp.weight" in f.tensors:
        f.require(p + "ffn_gate_inp_shexp.weight", (1, d))
        shared_gate = f.load_tensor(p + "ffn_gate_inp_shexp.weight", torch.float32).double()   # [1, d_model]
    select = None
    if p + "exp_probs_b.bias" in f.tensors:   # lfm2moe's selection bias
        f.require(p + "exp_probs_b.bias", (e,))
        select = f.load_tensor(p + "exp_probs_b.bias", torch.float32).reshape(e).contiguous()
    return MoeWeights(router, gate_up, Experts((down,), e), shared_gate, *_biases(f, p, e, ff, d), select_bias=select)


def _biases(f: GGUFFile, p: str, e: int, ff: int, d: int) -> tuple[torch.Tensor | None, ...]:
    """gpt-oss's router and expert biases, float32, where the file has them: (router [E],
    gate|up [E, 2F] in the experts' row order, down [E, d_model]). The gate and up biases come
    together or not at all (a half-biased pair is no model llama.cpp loads)."""
    def opt(name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        if p + name not in f.tensors:
            return None
        f.require(p + name, shape)
        return f.load_tensor(p + name, torch.float32).reshape(shape).contiguous()
    gate, up = opt("ffn_gate_exps.bias", (e, ff)), opt("ffn_up_exps.bias", (e, ff))
    if (gate is None) != (up is None):
        raise GGUFError(f.path, f"{p}ffn_gate_exps.bias and {p}ffn_up_exps.bias come in a pair")
    gate_up = None if gate is None else torch.cat([gate, up], dim=1)
    return opt("ffn_gate_inp.bias", (e,)), gate_up, opt("ffn_down_exps.bias", (e, d))


def expert_rows(f: GGUFFile, name: str, shape: tuple[int, int, int], kind: str, dtype: torch.dtype) -> QWeight:
    """A 3-D expert tensor `[E, n, k]` as rows `[E * n, k]`: the file's blocks (q) or dequantized floats."""
    info = f.require(name, shape)
    e, n, k = shape
    if kind == "q":
        return from_mapped(f.tensor_bytes(info), info.ggml_type, (e * n, k))
    return float_rows(f.load_tensor(name, dtype).reshape(e * n, k))                   # [E * n, k]


def float_rows(dense: torch.Tensor) -> QWeight:
    """Float rows `[n, k]` (float32, bfloat16 or float16) as a QWeight of their format: a view."""
    dense = dense.contiguous()
    return QWeight(dense.view(torch.uint8), int(_FLOAT_TYPES[dense.dtype]), dense.shape[1], dense.shape[0])
