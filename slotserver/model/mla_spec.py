"""`MlaSpec`: multi-head latent attention's sizes (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash: llama.cpp's
deepseek2), from GGUF metadata as llama.cpp's loader reads them.

MLA stores per token one `kv_lora_rank`-wide latent c (RMS-normed) and one shared `rope`-wide rotated
key k_pe, instead of per-head keys and values. Absorbed (llama.cpp's path for files converted with
`attn_k_b` / `attn_v_b`), it is multi-query attention with one KV head of `rope + kv_lora_rank`:

    q_h     = [rope(q_pe_h) | W_kb[h] q_nope_h]        # [rope + rank] per query head
    k = v   = [rope(k_pe)   | c]                        # one KV head, the cache row
    out_h   = W_vb[h] (softmax(q_h . k * kq_scale) v)[rope:]   # [v_dim] per head, then attn_output

So the cache row is `head_dim = rope + kv_lora_rank` wide (576 for DeepSeek), the rotated part first
so that a KV shift re-rotates it as any key's first `rope_dim` dims (model/rope_shift.py). V is the
same row: the attention kernels take K and V of one width, so the cache holds it twice and the
output's first `rope` dims (the rotated key's, weighted) are dropped; llama.cpp keeps it once (V a
view of K), so the cache takes twice its bytes here.

Files converted before llama.cpp's absorbed path (mid 2025) hold `attn_kv_b` (k_nope and v for every
head from c) and describe the heads as multi-head (`key_length` nope + rope, `value_length` v_dim,
`head_count_kv` n_heads); they load split into the same W_kb / W_vb (model/mla_layer.py) and run the
same absorbed attention, the same function of the weights as llama.cpp's multi-head path for them.

The q.k scale is llama.cpp's deepseek2 graph's: mscale^2 / sqrt(nope + rope) with
mscale = attn_factor (1 + 0.1 ln(1/freq_scale)) (1 + 0.1 yarn_log_mul ln(1/freq_scale)), where the
file's `rope.scaling.yarn_log_multiplier` is 0.1 x DeepSeek's mscale_all_dim (the converter's
[TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]) and `attn_factor` the rope's cos/sin factor (rope_scaling.py's
`deepseek_mscale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slotserver.model.rope_scaling import RopeScaling


@dataclass(frozen=True)
class MlaSpec:
    q_lora_rank: int      # q through a [q_lora_rank] bottleneck (attn_q_a, RMSNorm, attn_q_b); 0: attn_q
    kv_lora_rank: int     # the latent's width
    nope: int             # each query head's unrotated width (its key's, before absorption)
    rope: int             # the rotated width of each query head and of the shared key (rope.dimension_count)
    v_dim: int            # each head's value width after W_vb
    legacy: bool = False  # attn_kv_b in the file (split at load), not attn_k_b / attn_v_b

    @classmethod
    def from_metadata(cls, key, n_heads: int, rope_dim: int) -> "MlaSpec":
        """`key`: spec_keys.py's MetaKeys over a deepseek2 file. llama.cpp reads `q_lora_rank` unless
        its layer count says "lite" (26 or 27 layers); here a file without the key is one whose q comes
        from attn_q, whatever its depth (the loader then requires attn_q)."""
        rank = key.int("attention.kv_lora_rank")
        q_rank = key.int("attention.q_lora_rank") if key.has("attention.q_lora_rank") else 0
        if key.has("attention.key_length_mla"):
            k_mla, v_mla = key.int("attention.key_length_mla"), key.int("attention.value_length_mla")
            if key.int("attention.key_length") != rank + rope_dim or key.int("attention.value_length") != rank:
                raise key.error(f"attention.key_length / value_length {key.raw('attention.key_length')} / "
                                f"{key.raw('attention.value_length')} are not the latent's {rank + rope_dim} / {rank}")
            if key.int("attention.head_count_kv", n_heads) != 1:
                raise key.error("an MLA file with key_length_mla must have attention.head_count_kv 1")
            return cls(q_rank, rank, k_mla - rope_dim, rope_dim, v_mla)._checked(key)
        k_len, v_len = key.int("attention.key_length"), key.int("attention.value_length")
        return cls(q_rank, rank, k_len - rope_dim, rope_dim, v_len, legacy=True)._checked(key)

    def _checked(self, key) -> "MlaSpec":
        if self.nope < 1:
            raise key.error(f"MLA key length {self.nope} leaves no unrotated dims beside the rope's")
        return self

    @property
    def qk_dim(self) -> int:
        """A query head's width before absorption: nope + rope (llama.cpp's n_embd_head_k_mla)."""
        return self.nope + self.rope

    @property
    def row(self) -> int:
        """The cache row (the one KV head's head_dim): rope + kv_lora_rank."""
        return self.rope + self.kv_lora_rank

    def q_width(self, n_heads: int) -> int:
        """q's columns in a layer's fused input projection: q_a's (the low rank), or attn_q's."""
        return self.q_lora_rank or n_heads * self.qk_dim


def mla_scale(key, rope: RopeScaling, mla: MlaSpec) -> float:
    """llama.cpp's deepseek2 q.k scale (see the module docstring); `key`: the file's MetaKeys (its
    yarn_log_multiplier, divided by 0.1 in float32 as llama.cpp's loader does)."""
    log_mul = float(np.float32(key.float("rope.scaling.yarn_log_multiplier", 0.0)) / np.float32(0.1))
    stretch = math.log(1.0 / rope.freq_scale)
    attn_factor_org = rope.attn_factor * (1.0 + 0.1 * stretch)
    mscale = attn_factor_org * (1.0 + 0.1 * log_mul * stretch)
    return mscale * mscale / math.sqrt(mla.qk_dim)
