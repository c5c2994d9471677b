"""GGUF metadata -> a validated `ModelSpec`, driven by the table of architectures (archs.py: one
`ArchDef` row of switches each).
Everything else (GQA, head sizes, rope base and scaling, window size) comes from the metadata keys
llama.cpp reads (`{arch}.block_count`, `{arch}.attention.sliding_window`, ...), with llama.cpp's
defaults (src/llama-model.cpp, src/models/<arch>.cpp).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from slotserver.model.archs import ARCHS
from slotserver.model.gguf_file import GGUFError, GGUFFile
from slotserver.model.mla_spec import MlaSpec, mla_scale
from slotserver.model.moe_spec import MoeSpec
from slotserver.model.recurrent_spec import RecurrentSpec
from slotserver.model.rope_scaling import RopeFlags, RopeScaling
from slotserver.model.spec_keys import (MetaKeys, attn_bias, attn_scale, embed_scale, ffn_lengths, kv_heads,
                                        alpha_base, logit_scale, no_rope_step, residual_scale, sliding_windows,
                                        text_still_pairs)


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    ctx_train: int
    norm_eps: float
    rope_base: float
    rope_dim: int
    rope_scale: float          # positions are multiplied by this (1 / scaling factor; llama.cpp's freq_scale)
    tied_embeddings: bool
    qkv_bias: bool
    rope_mode: str
    has_rope_freqs: bool       # llama3-style per-frequency factors in `rope_freqs.weight`
    rope: RopeScaling = RopeScaling()   # yarn / longrope details beyond `rope_scale`
    windows: tuple[int, ...] = ()       # per layer: sliding window in cells (0: full attention)
    rope_base_swa: float = 10000.0      # rope base of windowed layers
    rope_scale_swa: float = 1.0
    swa_rope_plain: bool = False        # windowed layers' rope without yarn's blend and magnitude (olmo2)
    pre_norms: bool = True              # RMSNorm before attention and FFN (olmo2: none)
    attn_scale: float = 0.0    # q.k multiplier (0: 1/sqrt(head_dim))
    attn_softcap: float = 0.0  # scores -> c * tanh(scores / c) (gemma2); 0: off
    final_softcap: float = 0.0  # logits -> c * tanh(logits / c); 0: off
    embed_scale: float = 1.0   # the embedding rows are multiplied by this
    residual_scale: float = 1.0  # attention and FFN outputs are multiplied by this before the add
    logit_scale: float = 1.0   # logits are multiplied by 1 / this (granite)
    qk_norm: bool = False
    post_norms: bool = False
    act: str = "silu"
    fused: bool = False
    qk_norm_full: bool = False
    qk_norm_late: bool = False  # the per-head q/k norms after rope, not before (hunyuan-dense)
    moe: MoeSpec | None = None  # a mixture-of-experts FFN in every layer from moe.dense_lead (None: dense)
    out_bias: bool = False      # the attention output projection has a bias
    sinks: bool = False         # every layer has attention sinks (attn_sinks.weight, one per query head)
    ffn_norm: str = "ffn_norm"  # name of each layer's FFN pre-norm tensor (blk.N.<name>.weight)
    no_rope_step: int = 0       # layer i unrotated when (i + 1) % no_rope_step == 0 (smollm3); 0: every layer rotated
    nope_full: bool = False     # a windowed model's full-attention layers unrotated (exaone4)
    still_pairs: tuple[int, ...] = ()   # rotary pairs M-RoPE leaves unrotated for text (spec_keys.text_still_pairs)
    bidirectional: bool = False  # an embedding model attending both ways (gemma-embedding): no generation
    attn_temp_scale: float = 0.0  # mistral3: q x (1 + this * ln(1 + floor(pos / rope.file_ctx))) (0: off)
    recurrent: RecurrentSpec | None = None  # a hybrid model's delta-net layers (None: every layer attends)
    attn_gate: bool = False     # the attention output times sigmoid(a per-head gate from attn_q) (qwen35)
    out_norm: str = "output_norm"  # the final RMSNorm's tensor name (without .weight)
    # per layer: an FFN alone (nemotron_h's MLP blocks), the other layers then a mixer alone; (): every
    # layer a mixer then an FFN
    ffn_only: tuple[bool, ...] = ()
    parallel_mixers: bool = False  # falcon-h1: every layer attention and a Mamba-2 mixer, summed (KV and a state each)
    mla: MlaSpec | None = None  # latent attention (deepseek2): one KV head of head_dim = rope + kv_lora_rank

    @functools.cached_property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers with a KV cache: all, or a hybrid model's attention layers (not its recurrent
        layers, nor nemotron_h's FFN-only ones)."""
        if (self.recurrent is None and not self.ffn_only) or self.parallel_mixers:
            return tuple(range(self.n_layers))
        recurrent = self.recurrent.layers if self.recurrent is not None else (False,) * self.n_layers
        return tuple(i for i in range(self.n_layers) if not recurrent[i] and not (self.ffn_only and self.ffn_only[i]))

    @property
    def n_kv_layers(self) -> int:
        return len(self.kv_layers)

    @functools.cached_property
    def _kv_of(self) -> dict[int, int]:
        return {layer: j for j, layer in enumerate(self.kv_layers)}

    def kv_index(self, layer: int) -> int:
        """The KV cache layer of model layer `layer` (a hybrid model's attention layers are numbered
        apart: its recurrent layers have no KV)."""
        return self._kv_of[layer]

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def q_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def rotated(self, layer: int) -> bool:
        """Whether layer's q and k get RoPE (smollm3's every 4th layer, a windowed exaone4's full
        layers: no)."""
        if self.nope_full and self.windows and not self.window(layer):
            return False
        return not (self.no_rope_step and (layer + 1) % self.no_rope_step == 0)

    def layer_spec(self, layer: int) -> "ModelSpec":
        """The spec a layer's weights load with: without the MoE for a leading dense layer
        (lfm2moe's first `leading_dense_block_count`: a plain FFN of `d_ff`), without an FFN for a
        mixer-only layer (nemotron_h's), else this one."""
        if self.ffn_only and not self.ffn_only[layer]:
            return replace(self, d_ff=0, moe=None)
        if self.moe is None or layer >= self.moe.dense_lead:
            return self
        return replace(self, moe=None)

    def rope_params(self, layer: int) -> tuple[float, float, bool, bool]:
        """(base, freq_scale, rotated, scaled) of a layer's rope table (RopeTable's arguments):
        windowed layers have their own base and scale (gemma2/3, olmo2), unscaled by yarn where
        `swa_rope_plain` (olmo2); smollm3's NoPE layers are not rotated."""
        if self.window(layer):
            return self.rope_base_swa, self.rope_scale_swa, self.rotated(layer), not self.swa_rope_plain
        return self.rope_base, self.rope_scale, self.rotated(layer), True

    @classmethod
    def from_gguf(cls, f: GGUFFile, rope_flags: RopeFlags = RopeFlags()) -> "ModelSpec":
        """rope_flags: llama-server's --rope-*/--yarn-* settings over the file's (rope_scaling.py)."""
        md = f.metadata
        arch = md.get("general.architecture")
        if arch in ("bert", "nomic-bert", "modern-bert"):   # encoders: model/encoder/, `serve --embedding`
            raise GGUFError(f"{f.path}: {arch} is an embedding model, it generates no text: serve it with "
                            "`slotserver serve --embedding` (or --reranking)")
        if arch not in ARCHS:
            raise GGUFError(f"{f.path}: unknown architecture {arch!r} (supported: {', '.join(ARCHS)})")
        a, key = ARCHS[arch], MetaKeys(f, arch)
        n_heads, d_model, n_layers = key.int("attention.head_count"), key.int("embedding_length"), key.int("block_count")
        # MTP blocks (Qwen3.5's, GLM-4.7-Flash's): not run (llama.cpp's default)
        n_layers -= key.raw("nextn_predict_layers", 0) if a.hybrid or a.mla else 0
        head_dim = key.int("attention.key_length", d_model // n_heads)
        rope_dim = key.int("rope.dimension_count", head_dim)
        mla = MlaSpec.from_metadata(key, n_heads, rope_dim) if a.mla else None
        if mla is not None:   # one KV head of the latent's row (mla_spec.py)
            head_dim = mla.row
        elif key.int("attention.value_length", head_dim) != head_dim:
            raise GGUFError(f"{f.path}: attention.value_length differs from key_length (not supported)")
        trained = alpha_base(a, key, RopeScaling.from_metadata(key, rope_dim, deepseek_mscale=a.mla), head_dim)
        rope = RopeScaling.from_metadata(key, rope_dim, rope_flags, a.mla) if rope_flags.any else trained
        rope = rope if rope_flags.freq_base else replace(rope, base=trained.base)   # (--rope-freq-base wins)
        windows, base_swa, scale_swa = sliding_windows(a, key, n_layers, trained if a.swa_rope_file else rope)
        d_ff, ffn_only = ffn_lengths(a, key, n_layers)
        spec = cls(
            arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
            n_kv_heads=1 if mla else kv_heads(key, n_heads, a.hybrid in ("shortconv", "mamba2")), head_dim=head_dim,
            d_ff=d_ff,
            vocab_size=key.int("vocab_size", len(md.get("tokenizer.ggml.tokens", ())) or None),
            ctx_train=_ctx_train(key.int("context_length"), rope, trained),
            norm_eps=key.float("attention.layer_norm_rms_epsilon",   # nemotron_h: the layer-norm key stands in
                               key.raw("attention.layer_norm_epsilon", 1e-5) if a.eps_layer_norm else 1e-5),
            rope_base=rope.base, rope_dim=rope_dim, rope_scale=rope.freq_scale,
            tied_embeddings="output.weight" not in f.tensors,
            qkv_bias=a.qkv_bias or attn_bias(f, a), rope_mode=a.rope_mode,
            has_rope_freqs="rope_freqs.weight" in f.tensors, rope=rope,
            windows=windows, rope_base_swa=base_swa, rope_scale_swa=scale_swa,
            attn_scale=mla_scale(key, rope, mla) if mla else attn_scale(a, key, n_layers, d_model, n_heads, head_dim),
            attn_softcap=key.float("attn_logit_softcapping", 50.0) if a.softcap else 0.0,
            final_softcap=key.float("final_logit_softcapping", 30.0 if a.softcap else 0.0),
            embed_scale=embed_scale(a, key, d_model, n_layers),
            residual_scale=residual_scale(a, key, n_layers),
            logit_scale=logit_scale(a, key, d_model),
            qk_norm=a.qk_norm, post_norms=a.post_norms, act=a.act, fused=a.fused, qk_norm_full=a.qk_norm_full,
            qk_norm_late=a.qk_norm_late,
            moe=None if a.one_expert_dense and key.raw("expert_count", 0) <= 1 else
            MoeSpec.from_metadata(key, a.moe_norm, a.moe_gating, a.moe_act, a.moe_keys, a.moe_file_weights, a.moe_latent,
                                  a.moe_shared_count),
            out_bias=a.out_bias, sinks=a.sinks, ffn_norm=a.ffn_norm, no_rope_step=no_rope_step(a, key),
            attn_temp_scale=key.float("attention.temperature_scale", 0.0) if a.attn_temp else 0.0,
            swa_rope_plain=a.swa_rope_plain, pre_norms=a.pre_norms, nope_full=a.nope_full,
            bidirectional=a.bidirectional,
            recurrent=(RecurrentSpec.from_metadata(key, n_layers, a.hybrid, d_model, a.parallel_mixers, ffn_only)
                       if a.hybrid else None),
            attn_gate=a.attn_gate, out_norm=a.out_norm, ffn_only=ffn_only, parallel_mixers=a.parallel_mixers, mla=mla,
        )
        if a.mrope:
            spec = replace(spec, still_pairs=text_still_pairs(key, rope_dim, a.mrope == "imrope"))
        if a.hybrid and key.raw("attention.causal", True) is False:   # LFM2's bidirectional embedders
            raise GGUFError(f"{f.path}: a non-causal {arch} (an embedding model) is not supported")
        if a.mla and key.raw("attention.temperature_scale", 0):   # Mistral Large 3's q temperature
            raise GGUFError(f"{f.path}: {arch} with attention.temperature_scale is not supported")
        if a.attn_temp and spec.moe is not None:
            raise GGUFError(f"{f.path}: {arch} with experts is not supported (its dense models are)")
        spec._validate(f)
        return spec

    def _validate(self, f: GGUFFile) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(f"head_count {self.n_heads} is not a multiple of head_count_kv {self.n_kv_heads}")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            problems.append(f"rope dimension {self.rope_dim} must be even and <= head dim {self.head_dim}")
        if not (0 < self.norm_eps < 1):
            problems.append(f"rms epsilon {self.norm_eps} out of range")
        for name in ("rope_base", "rope_base_swa"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                problems.append(f"{name.replace('_', ' ')} {getattr(self, name)} must be positive")
        for name in ("attn_softcap", "final_softcap", "logit_scale"):
            if getattr(self, name) < 0 or (name == "logit_scale" and self.logit_scale == 0):
                problems.append(f"{name} {getattr(self, name)} out of range")
        if problems:
            raise GGUFError(f"{f.path}: bad model metadata: {'; '.join(problems)}")


def _ctx_train(ctx: int, rope: RopeScaling, trained: RopeScaling) -> int:
    """The training context, or with a YaRN factor of the command line's the context it stretches to
    (llama_init_from_model: n_ctx_train = n_ctx_orig_yarn / freq_scale), which /props reports."""
    if rope.kind == "yarn" and rope.freq_scale != trained.freq_scale:   # in float32, as llama.cpp divides
        return int(np.float32(rope.orig_ctx) / np.float32(rope.freq_scale))
    return ctx
