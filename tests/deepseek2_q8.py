"""A deepseek2 file with Q8_0 matmuls (tests/test_step_graph.py, tests/test_arch_fixtures.py): the
arch fixture's layout rewritten at widths Q8_0 blocks take."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf_rewrite import rewrite


def deepseek2_q8(dst: Path) -> Path:
    """The deepseek2 fixture's layout (a dense layer, then experts; q_lora; MLA) at widths that Q8_0
    blocks take (every row a multiple of 32), random Q8_0 matmuls: what a real file's step runs."""
    d, h, rank, rope, nope, v, qr, ff, eff, e = 64, 4, 64, 32, 32, 32, 64, 64, 32, 8
    shapes = {"token_embd": (310, d), "output": (310, d), "attn_q_a": (qr, d), "attn_q_b": (h * (nope + rope), qr),
              "attn_kv_a_mqa": (rank + rope, d), "attn_k_b": (h, rank, nope), "attn_v_b": (h, v, rank),
              "attn_output": (d, h * v), "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff),
              "ffn_gate_inp": (e, d), "ffn_gate_exps": (e, eff, d), "ffn_up_exps": (e, eff, d),
              "ffn_down_exps": (e, d, eff), "ffn_gate_shexp": (eff, d), "ffn_up_shexp": (eff, d),
              "ffn_down_shexp": (d, eff), "exp_probs_b": (e,), "attn_q_a_norm": (qr,), "attn_kv_a_norm": (rank,)}
    rng = np.random.default_rng(0)

    def tensor(name, data, kind):
        shape = shapes.get(name.split(".")[-2], (d,))
        if len(shape) == 1:   # norms around 1, the selection bias around 0
            return (rng.standard_normal(shape) * 0.3 + (0 if "exp_probs" in name else 1)).astype(np.float32), \
                gguf.GGMLQuantizationType.F32
        w = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    u32 = gguf.GGUFValueType.UINT32
    keys = {f"deepseek2.{k}": (n, u32) for k, n in (
        ("embedding_length", d), ("feed_forward_length", ff), ("expert_feed_forward_length", eff),
        ("attention.key_length", rank + rope), ("attention.value_length", rank), ("attention.key_length_mla",
        nope + rope), ("attention.value_length_mla", v), ("attention.kv_lora_rank", rank),
        ("attention.q_lora_rank", qr), ("rope.dimension_count", rope))}
    return rewrite(Path(__file__).parent / "fixtures" / "archs" / "deepseek2.gguf", dst, keys, tensor)
