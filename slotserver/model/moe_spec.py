"""`MoeSpec`: how a mixture-of-experts FFN routes, from GGUF metadata as llama.cpp reads it.

llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) is one function with a few switches that each
architecture's graph (src/models/<arch>.cpp) sets; `MoeSpec` holds the same switches:

- `gating`: how router logits become probabilities. "softmax" (qwen2moe, qwen3moe, olmoe,
  granitemoe: softmax over all experts, then the top k); "softmax_weight" (gpt-oss: top k of the
  raw logits, then softmax over the k selected); "sigmoid" (lfm2moe: each logit's sigmoid, the
  file's `expert_gating_func` 2). Selection is by probability plus a layer's selection bias where
  the file has one (`exp_probs_b`: lfm2moe, DeepSeek-V3), the weights are the unbiased ones.
- `dense_lead`: the first layers keep a dense FFN (`leading_dense_block_count`: lfm2moe's 2).
- `norm_weights`: the k weights divided by their sum (clamped at 6.1e-5, float16's smallest
  normal, as llama.cpp): qwen3moe, qwen3vlmoe, qwen35moe, granitemoe, granitehybrid, lfm2moe and
  the llama / mistral / granite / minicpm files with experts always (llama.cpp does not read
  `norm_topk_prob` for them), olmoe and qwen2moe never; nemotron_h_moe as its file says.
- `d_ff`: one expert's hidden size (`expert_feed_forward_length`, else `feed_forward_length`);
  `d_ff_shared`: a shared expert's (`expert_shared_feed_forward_length`; qwen2moe, granite MoE
  shared), run on every token beside the routed ones; qwen2moe's is scaled by a sigmoid gate
  (`ffn_gate_inp_shexp`), granite's is not.

- `act`: the experts' gated activation. "silu" (SwiGLU, silu(gate) * up); "swiglu_oai" (gpt-oss,
  ggml's `swiglu_oai`: gate clamped to at most 7, up to [-7, 7], gate * sigmoid(1.702 gate) * (up
  + 1); alpha and limit are constants in llama.cpp too); "relu2" (nemotron_h_moe: no gate, the
  experts' up projection squared after a ReLU). gpt-oss's router and expert biases are data
  (`MoeWeights`), not switches: a layer has them where the file does.
- `file_weights`: `norm_weights` and `weights_scale` read from `expert_weights_norm` and
  `expert_weights_scale` (nemotron_h_moe's loader reads them; the others' are constants).
- `latent` (read where the architecture says, `ArchDef.moe_latent`: nemotron_h_moe's loader):
  Nemotron 3 Super's experts work on `moe_latent_size` values: the normed rows go down to it (`ffn_latent_down`)
  before the experts and their weighted sum comes back up (`ffn_latent_up`); the router and the
  shared expert see the full rows.
- `expert_group_count` above 1 (DeepSeek-V3's grouped selection, which llama.cpp applies for any
  file that says so) is refused: DeepSeek-V2 (236B) and V3/R1 (671B) group theirs; the deepseek2
  models that fit a host (V2-Lite, Moonlight, Kimi's and GLM-4.7-Flash) have one group.
- deepseek2's gating comes from the file (`file_gating`) and its shared expert is
  `expert_shared_count` experts wide, ungated.

The routing is this table, not code per architecture; the experts' matmul
(kernels/moe_matmul.py) takes any `Experts`.
"""

from __future__ import annotations

from dataclasses import dataclass

GATINGS = ("softmax", "softmax_weight", "sigmoid")
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}   # llama.cpp's expert_gating_func
ACTS = ("silu", "swiglu_oai", "relu2")


@dataclass(frozen=True)
class MoeSpec:
    n_expert: int
    n_used: int
    d_ff: int
    d_ff_shared: int = 0
    norm_weights: bool = False
    gating: str = "softmax"
    weights_scale: float = 1.0   # the k weights times this (llama.cpp's expert_weights_scale; 1 for these archs)
    act: str = "silu"
    dense_lead: int = 0          # layers before this one have a dense FFN, not this MoE
    latent: int = 0              # the experts' width where they work in a latent space (Nemotron 3 Super); 0: d_model

    def __post_init__(self) -> None:
        assert self.gating in GATINGS, f"gating must be one of {GATINGS}, got {self.gating!r}"
        assert self.act in ACTS, f"act must be one of {ACTS}, got {self.act!r}"

    @classmethod
    def from_metadata(cls, key, norm_weights: bool, gating: str = "softmax", act: str = "silu",
                      keys: bool = False, file_weights: bool = False, latent: bool = False,
                      shared_count: bool = False) -> "MoeSpec | None":
        """None where the file has no experts (`{arch}.expert_count` absent or 0). `key`: spec.py's
        `MetaKeys` (spec_keys.py) over the file's `{arch}.*` metadata (range-checked, one-line errors). `keys`: read
        `leading_dense_block_count` and check `expert_gating_func`, as llama.cpp's loader does for
        the architectures that say so (ArchDef.moe_keys: lfm2moe); the others ignore them, as it does.
        gating "file": the file's `expert_gating_func` (`file_gating`); `shared_count`: the shared
        expert is `expert_shared_count` experts wide (deepseek2's loader)."""
        if not key.raw("expert_count", 0):
            return None
        n_expert, n_used = key.int("expert_count"), key.int("expert_used_count")
        if n_used > n_expert:
            raise key.error(f"expert_used_count {n_used} exceeds expert_count {n_expert}")
        d_ff = key.int("expert_feed_forward_length", key.raw("feed_forward_length"))
        shared = key.int("expert_shared_feed_forward_length") if key.has("expert_shared_feed_forward_length") else 0
        if shared_count:
            shared = d_ff * key.int("expert_shared_count") if key.raw("expert_shared_count", 0) else 0
        gating = file_gating(key) if gating == "file" else gating
        lead = key.raw("leading_dense_block_count", 0) if keys else 0
        if not isinstance(lead, int) or isinstance(lead, bool) or lead < 0:
            raise key.error(f"leading_dense_block_count {lead!r} is not a count of layers")
        if keys and key.has("expert_gating_func") and GATING_FUNCS.get(key.raw("expert_gating_func")) != gating:
            raise key.error(f"expert_gating_func {key.raw('expert_gating_func')} is not this architecture's "
                            f"{gating} (llama.cpp's codes: {GATING_FUNCS})")
        groups = key.raw("expert_group_count", 0)
        if not isinstance(groups, int) or groups > 1:
            raise key.error(f"expert_group_count {groups!r}: grouped expert selection is not supported")
        scale = 1.0
        if file_weights:
            norm_weights = key.raw("expert_weights_norm", False) is True
            scale = key.float("expert_weights_scale", 1.0) or 1.0   # 0, as llama.cpp: no scale
        width = key.int("moe_latent_size") if latent and key.raw("moe_latent_size") else 0   # nemotron_h_moe
        return cls(n_expert, n_used, d_ff, shared, norm_weights, gating, scale, act=act, dense_lead=lead, latent=width)


def file_gating(key) -> str:
    """deepseek2's gating as llama.cpp's loader picks it: the file's `expert_gating_func`; without one,
    softmax (DeepSeek V2 and V2.5 files), or sigmoid for GLM-4.7-Flash's shape (47 or 48 layers, a
    154880-entry vocabulary), whose early files lacked the key."""
    code = key.raw("expert_gating_func", 0)
    if code in GATING_FUNCS and GATING_FUNCS[code] != "softmax_weight":
        return GATING_FUNCS[code]
    if code:
        raise key.error(f"expert_gating_func {code!r} is not supported (llama.cpp's codes: {GATING_FUNCS})")
    vocab = key.raw("vocab_size") or len(key.f.metadata.get("tokenizer.ggml.tokens", ()))
    return "sigmoid" if key.raw("block_count") in (47, 48) and vocab == 154880 else "softmax"
