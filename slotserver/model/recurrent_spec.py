"""`RecurrentSpec`: the recurrent layers of a hybrid model (Qwen3.5, LFM2, Granite 4.0-H), from GGUF metadata.

A hybrid model interleaves full-attention layers (with a KV cache) and linear-attention layers
that carry a fixed-size recurrent state per sequence instead (model/delta_net.py). llama.cpp's
qwen35 reads (src/models/qwen35.cpp):

- `ssm.conv_kernel`: the causal depthwise convolution's width over q|k|v (4);
- `ssm.state_size`: the head size of q and k (the delta-net state is [head_k, head_v] per head);
- `ssm.group_count`: q/k heads; `ssm.time_step_rank`: v heads (a multiple of them: v head h
  reads q/k head h % group_count, the converter having put the V heads in that tiled order);
- `ssm.inner_size`: v heads x v head size;
- which layers are recurrent: `attention.recurrent_layers` (one flag a layer) where present, else
  every layer but each `full_attention_interval`-th (default 4: layers 3, 7, ... attend).

The state of a sequence is then, per recurrent layer, the last `conv_kernel - 1` inputs of the
convolution and a [v_heads, head_k, head_v] float32 matrix: what runtime/recurrent_state.py keeps
per stream.

LFM2's short-convolution layers (kind "shortconv", src/models/lfm2.cpp) keep only the convolution's
inputs: `shortconv.l_cache` wide over d_model channels; a layer is one where
`attention.head_count_kv` (an array there) is 0. Granite 4.0-H's Mamba-2 layers (kind "mamba2",
src/models/granite-hybrid.cpp, `_mamba2`) keep the convolution's inputs and a [heads, N, head size]
state a layer.
"""

from __future__ import annotations

from dataclasses import dataclass


KINDS = ("gdn", "shortconv", "mamba2")


@dataclass(frozen=True)
class RecurrentSpec:
    d_conv: int                 # the convolution's width (tokens)
    n_k_heads: int              # q and k heads (gdn; 0 for shortconv)
    n_v_heads: int              # v heads (and state matrices; 0: no matrix state)
    head_k: int                 # q/k head size
    head_v: int                 # v head size
    layers: tuple[bool, ...]    # per layer: has a recurrent mixer and state (else attention; falcon-h1: both)
    kind: str = "gdn"           # "gdn": gated delta net (qwen35); "shortconv": LFM2's; "mamba2": Granite 4.0-H's
    channels: int = 0           # shortconv: the convolution's channels (d_model)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q | k | v of the in-projection (gdn), d_model (shortconv)."""
        return self.channels if self.kind == "shortconv" else 2 * self.key_dim + self.value_dim

    @property
    def proj_dim(self) -> int:
        """Rows of the fused in-projection: q|k|v, the output gate z, beta and alpha (one a v head);
        shortconv: its gates B and C and its input x, d_model each."""
        if self.kind == "shortconv":
            return 3 * self.channels
        if self.kind == "mamba2":   # z | x B C | dt
            return self.conv_dim + self.value_dim + self.n_v_heads
        return self.conv_dim + self.value_dim + 2 * self.n_v_heads

    @property
    def recurrent_layers(self) -> list[int]:
        return [i for i, r in enumerate(self.layers) if r]

    @classmethod
    def from_metadata(cls, key, n_layers: int, kind: str, d_model: int, every_layer: bool = False,
                      ffn_only: tuple[bool, ...] = ()) -> "RecurrentSpec":
        """key: spec_keys.py's `MetaKeys` on the file's `{arch}.*` metadata. every_layer: each layer
        has a recurrent mixer (beside its attention: falcon-h1). ffn_only: `ModelSpec.ffn_only`
        (nemotron_h's FFN-only layers have no KV heads and no mixer either)."""
        assert kind in KINDS, kind
        if kind == "shortconv":
            kv = key.raw("attention.head_count_kv")
            if not isinstance(kv, list) or len(kv) != n_layers:
                raise key.error(f"attention.head_count_kv must give each of the {n_layers} layers its KV heads "
                                "(0 for a short-convolution layer)")
            return cls(_width(key, "shortconv.l_cache"), 0, 0, 0, 0, tuple(h == 0 for h in kv), kind, d_model)
        if kind == "mamba2":
            return _mamba2(cls, key, n_layers, every_layer, ffn_only)
        n_k, n_v, head_k = key.int("ssm.group_count"), key.int("ssm.time_step_rank"), key.int("ssm.state_size")
        inner = key.int("ssm.inner_size")
        if n_v % n_k or inner % n_v:
            raise key.error(f"ssm.time_step_rank {n_v} is not a multiple of ssm.group_count {n_k}, "
                            f"or ssm.inner_size {inner} of it")
        if inner // n_v != head_k:
            raise key.error(f"delta-net v head size {inner // n_v} differs from ssm.state_size {head_k} "
                            "(llama.cpp requires them equal)")
        flags = key.raw("attention.recurrent_layers")
        if flags is None:
            interval = key.int("full_attention_interval", 4)
            layers = tuple((i + 1) % interval != 0 for i in range(n_layers))
        elif isinstance(flags, list) and len(flags) >= n_layers:
            layers = tuple(bool(x) for x in flags[:n_layers])
        else:
            raise key.error(f"attention.recurrent_layers must flag each of the {n_layers} layers")
        return cls(_width(key, "ssm.conv_kernel"), n_k, n_v, head_k, inner // n_v, layers)


def _mamba2(cls, key, n_layers: int, every_layer: bool = False, ffn_only: tuple[bool, ...] = ()) -> RecurrentSpec:
    """Granite 4.0-H's Mamba-2 layers (llama.cpp's granitehybrid): `ssm.group_count` groups of B and
    C, `ssm.time_step_rank` heads of `ssm.inner_size` / heads, `ssm.state_size` (N) each; a layer is
    one where `attention.head_count_kv` (an array) is 0 (and, for nemotron_h, `feed_forward_length`
    too: its MLP layers have neither). As RecurrentSpec: n_k_heads = groups,
    head_k = N, n_v_heads = heads, head_v = their size (the state [heads, N, head size])."""
    groups, heads, n, inner = (key.int(k) for k in ("ssm.group_count", "ssm.time_step_rank", "ssm.state_size",
                                                     "ssm.inner_size"))
    if heads % groups or inner % heads:
        raise key.error(f"ssm.time_step_rank {heads} is not a multiple of ssm.group_count {groups}, "
                        f"or ssm.inner_size {inner} of it")
    if every_layer:   # falcon-h1: a Mamba-2 mixer in every layer, beside its attention
        return cls(_width(key, "ssm.conv_kernel"), groups, heads, n, inner // heads, (True,) * n_layers, "mamba2")
    kv = key.raw("attention.head_count_kv")   # (nemotron_h_moe: an MTP block's entry past n_layers, not run)
    if not isinstance(kv, list) or len(kv) < n_layers:
        raise key.error(f"attention.head_count_kv must give each of the {n_layers} layers its KV heads "
                        "(0 for a Mamba-2 layer)")
    ffn = ffn_only or (False,) * n_layers
    return cls(_width(key, "ssm.conv_kernel"), groups, heads, n, inner // heads,
               tuple(h == 0 and not f for h, f in zip(kv[:n_layers], ffn)), "mamba2")


def _width(key, name: str) -> int:
    """A convolution's width: at least 2 (its state is the last width - 1 inputs; llama.cpp asserts it)."""
    width = key.int(name)
    if width < 2:
        raise key.error(f"{name} {width} must be at least 2")
    return width


def mtp_tensors(names, spec) -> frozenset[str]:
    """The tensors of a hybrid or deepseek2 model's multi-token-prediction blocks (`blk.N.*` from N = n_layers on,
    `nextn_predict_layers` of them): llama.cpp skips them unless asked to draft with them, so do we."""
    if spec.recurrent is None and spec.mla is None:   # (deepseek2: GLM-4.7-Flash's converter keeps its MTP block)
        return frozenset()
    return frozenset(n for n in names if n.startswith("blk.") and int(n.split(".")[1]) >= spec.n_layers)
