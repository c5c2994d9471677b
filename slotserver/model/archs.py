"""The architectures `ModelSpec.from_gguf` knows: one `ArchDef` row of switches each.

An architecture is a few switches the one forward (model.py) reads (q/k/v biases, rope mode, q/k
norms, post-norms, the gated FFN's activation, sliding-window pattern, soft-capping, fused tensors,
granite's multipliers, MoE weight renormalization, gating and activation, gpt-oss's output bias and
attention sinks, smollm3's NoPE layers, mistral3's q temperature, olmo2's missing pre-norms,
exaone4's unrotated full layers, the hybrids' recurrent layers, qwen35's gated attention and
nemotron_h's one-block layers, deepseek2's latent attention); glm4,
ernie4_5, seed_oss, internlm2, exaone, gemma, arcee, minicpm and the Qwen-VL language models are rows of
existing switches; hunyuan-dense adds two (late q/k norms, the NTK alpha). Apart from spec.py so that adding a row is an
edit of this table alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchDef:
    qkv_bias: bool = False       # always (qwen2); any file may have them too (llama.cpp's create_tensor_qkv)
    rope_mode: str = "normal"    # "normal": adjacent pairs (GGUF llama); "neox": half split (qwen2)
    embed_scale: str = "none"    # "sqrt_d": x * sqrt(d_model) (gemma); "metadata": {arch}.embedding_scale
    qk_norm: bool = False        # per-head RMSNorm of q and k before rope (attn_q_norm / attn_k_norm)
    qk_norm_late: bool = False   # with qk_norm: the norms after rope (hunyuan-dense)
    rope_alpha: bool = False     # rope.scaling.alpha > 0: the file's base times alpha^(d / (d - 2)) (NTK-aware, hunyuan)
    one_expert_dense: bool = False  # expert_count <= 1 means no experts (llama.cpp's hunyuan loaders)
    post_norms: bool = False     # RMSNorm of the attention and FFN outputs before the residual add
    act: str = "silu"            # FFN: "silu" (SwiGLU), "gelu" (tanh GELU, GeGLU), "relu2" (up, squared ReLU: no gate)
    swa_pattern: int = 0         # n > 0: layer i is windowed when i % n < n - 1 (llama.cpp's pattern)
    swa_default: int = 0         # window when the metadata has none (0: no window without the key)
    swa_rope_global: bool = False  # windowed layers keep the global rope base unless freq_base_swa (gemma2)
    swa_rope_plain: bool = False   # olmo2: windowed layers at the global base (freq_base_swa unread), no yarn
    # windowed layers' rope from the file whatever --rope-*/--yarn-* say (llama.cpp's graphs that call
    # get_rope_freq_base: gemma2/3, gemma-embedding, openai-moe); other windowed layers take the flags
    swa_rope_file: bool = False
    pre_norms: bool = True         # attn_norm / ffn_norm before each branch (olmo2 has post-norms only)
    softcap: bool = False        # gemma2: attention and final-logit soft-capping (defaults 50 / 30)
    fused: bool = False          # phi3: attn_qkv holds q|k|v and ffn_up holds gate|up
    multipliers: bool = False    # granite: embedding, residual, attention and logit multipliers
    minicpm_scales: bool = False  # with multipliers: minicpm's defaults where the keys are missing, no attention.scale
    gemma_scale: bool = False    # 27B gemmas scale q by 1/sqrt(d_model / n_heads), not 1/sqrt(head_dim)
    qk_norm_full: bool = False   # olmoe: q and k RMSNorm over the whole projection, not per head
    moe_norm: bool = False       # MoE: the k selected weights renormalized to sum 1 (moe_spec.py)
    moe_gating: str = "softmax"  # MoE: "softmax" then top-k, "softmax_weight": top-k then softmax (gpt-oss), "sigmoid",
                                 # "file": the file's expert_gating_func (deepseek2; moe_spec.py's file_gating)
    moe_act: str = "silu"        # MoE experts: "silu" (SwiGLU), "swiglu_oai" (gpt-oss's clamped form), "relu2"
    moe_file_weights: bool = False  # MoE: weight renormalization and scale from expert_weights_norm / _scale
    moe_keys: bool = False       # MoE: read leading_dense_block_count and expert_gating_func (lfm2moe's loader does)
    moe_latent: bool = False     # MoE: read moe_latent_size, the experts' latent width (nemotron-h.cpp's loader)
    eps_layer_norm: bool = False  # the RMS epsilon defaults to attention.layer_norm_epsilon (nemotron-h.cpp's loader)
    rope_switch: bool = False    # rope.scaling.finetuned false: no layer rotated (llama.cpp's granite loaders)
    out_bias: bool = False       # attn_output.bias (gpt-oss)
    sinks: bool = False          # attn_sinks.weight: a learned logit per query head in each softmax (gpt-oss)
    ffn_norm: str = "ffn_norm"   # the FFN's pre-norm tensor (gpt-oss names it post_attention_norm)
    no_rope_step: int = 0        # n > 0: layer i has no RoPE when (i + 1) % n == 0 (smollm3's NoPE layers)
    nope_full: bool = False      # with windows, the full-attention layers have no RoPE (exaone4)
    swa_n_layers: int = 0        # n > 0: windows only in a model of exactly n layers (llama.cpp's exaone4: 32B)
    bidirectional: bool = False  # an embedding model: attention both ways, windows symmetric (encoder/bidirectional.py)
    attn_temp: bool = False      # q scaled by position past the trained context (`attention.temperature_scale`)
    swa_all: bool = False        # with `attention.sliding_window` in the file: every layer windowed, global rope (lfm2)
    hybrid: str = ""             # recurrent layers between the attention layers: "gdn", "shortconv" (recurrent_spec.py)
    out_norm: str = "output_norm"  # the final norm's tensor (LFM2: token_embd_norm)
    attn_gate: bool = False      # attn_q holds q and an output gate per head: out * sigmoid(gate) (qwen35)
    single_blocks: bool = False  # one block a layer: an FFN alone where feed_forward_length says, else a mixer
    parallel_mixers: bool = False  # every layer: attention and a recurrent mixer side by side, summed (falcon-h1)
    mrope: str = ""              # "mrope" / "imrope": M-RoPE sections, neox rope for text (spec_keys.text_still_pairs)
    mla: bool = False            # multi-head latent attention (mla_spec.py: deepseek2), DeepSeek's YaRN magnitude
    moe_shared_count: bool = False  # MoE: the shared expert `expert_shared_count` experts wide (deepseek2)


ARCHS: dict[str, ArchDef] = {
    # with experts (Mixtral's kind: src/models/llama.cpp's build_moe_ffn), the top-k weights renormalized
    "llama": ArchDef(moe_norm=True),
    "mistral": ArchDef(moe_norm=True),
    "qwen2": ArchDef(qkv_bias=True, rope_mode="neox"),
    "qwen3": ArchDef(rope_mode="neox", qk_norm=True),
    "gemma2": ArchDef(rope_mode="neox", embed_scale="sqrt_d", post_norms=True, act="gelu", swa_pattern=2,
                      swa_default=4096, swa_rope_global=True, softcap=True, gemma_scale=True, swa_rope_file=True),
    "gemma3": ArchDef(rope_mode="neox", embed_scale="sqrt_d", qk_norm=True, post_norms=True, act="gelu",
                      swa_pattern=6, gemma_scale=True, swa_rope_file=True),
    "phi3": ArchDef(rope_mode="neox", fused=True),
    # llama.cpp's src/models/smollm3.cpp: llama with every 4th layer unrotated (n_no_rope_layer_step = 4)
    "smollm3": ArchDef(no_rope_step=4),
    # src/models/mistral3.cpp (Ministral 3, Mistral Small 3.x conversions): llama, yarn, and q multiplied by
    # 1 + temperature_scale * ln(1 + floor(pos / original_context_length)) where the key is set
    "mistral3": ArchDef(attn_temp=True, moe_norm=True),
    # src/models/olmo2.cpp (OLMo 2, and OLMo 3's windows on 3 of 4 layers): no pre-norms, the branches
    # post-normed, q and k normed over the whole projection; windowed layers rotate without yarn
    "olmo2": ArchDef(rope_mode="neox", qk_norm=True, qk_norm_full=True, post_norms=True, pre_norms=False,
                     swa_pattern=4, swa_rope_plain=True),
    "granite": ArchDef(embed_scale="metadata", multipliers=True, rope_switch=True, moe_norm=True),
    # src/models/glm4.cpp (GLM-4-0414, GLM-Z1): pre- and post-norms, q/k/v biases, gate|up in one ffn_up,
    # part of each head rotated (rope.dimension_count), adjacent pairs
    "glm4": ArchDef(qkv_bias=True, post_norms=True, fused=True),
    # src/models/ernie4-5.cpp (ERNIE-4.5 dense): llama's block
    "ernie4_5": ArchDef(),
    # the language models of Qwen2-VL / Qwen2.5-VL (src/models/qwen2vl.cpp: qwen2 with M-RoPE), Qwen3-VL
    # (qwen3vl.cpp: qwen3 with interleaved M-RoPE; its deepstack inputs are zeros for text) and Qwen3-VL MoE:
    # text only (images need a projector: refused)
    "qwen2vl": ArchDef(qkv_bias=True, rope_mode="neox", mrope="mrope"),
    "qwen3vl": ArchDef(rope_mode="neox", qk_norm=True, mrope="imrope"),
    "qwen3vlmoe": ArchDef(rope_mode="neox", qk_norm=True, moe_norm=True, mrope="imrope"),
    # src/models/hunyuan-vl.cpp, which hunyuan-dense's graph is (Hunyuan 0.5B-7B Instruct): NEOX rope, then
    # per-head q/k RMSNorm (after the rope), the base stretched by rope.scaling.alpha
    "hunyuan-dense": ArchDef(rope_mode="neox", qk_norm=True, qk_norm_late=True, rope_alpha=True,
                             one_expert_dense=True),
    # src/models/internlm2.cpp (InternLM2/2.5; the converter splits wqkv): llama's block
    "internlm2": ArchDef(),
    # src/models/exaone.cpp (EXAONE 3.0/3.5): llama's block, NEOX rope, llama3's rope_freqs where the file has them
    "exaone": ArchDef(rope_mode="neox"),
    # src/models/gemma.cpp (Gemma 1, CodeGemma): embedding x sqrt(d), NEOX rope, GELU gate, tied output
    "gemma": ArchDef(rope_mode="neox", embed_scale="sqrt_d", act="gelu"),
    # src/models/arcee.cpp (AFM-4.5B): llama's attention and rope_freqs, the FFN up -> squared ReLU -> down
    "arcee": ArchDef(act="relu2"),
    # src/models/minicpm.cpp (MiniCPM 1-4): granite's graph; embedding 12, residual 1.4 / sqrt(layers) and
    # logit 256 / d_model where the file has no such keys; MiniCPM-MoE's experts as granite's (renormalized)
    "minicpm": ArchDef(embed_scale="metadata", multipliers=True, minicpm_scales=True, moe_norm=True),
    # src/models/seed-oss.cpp (Seed-OSS): q/k/v biases, NEOX rope, the FFN's pre-norm named post_attention_norm
    "seed_oss": ArchDef(qkv_bias=True, rope_mode="neox", ffn_norm="post_attention_norm"),
    # src/models/exaone4.cpp (EXAONE 4.0): olmo2's post-norm block with per-head q/k norms; the 32B (64
    # layers) windows 3 of 4 layers (4096 cells unless the key says) and leaves the other layers unrotated
    "exaone4": ArchDef(rope_mode="neox", qk_norm=True, post_norms=True, pre_norms=False, swa_pattern=4,
                       swa_default=4096, swa_rope_global=True, nope_full=True, swa_n_layers=64),
    # src/models/gemma-embedding.cpp (EmbeddingGemma): gemma3's block attending both ways, windows of
    # n_swa/2 on each side on 5 of 6 layers; embeddings only (`serve --embedding`), never generation
    "gemma-embedding": ArchDef(rope_mode="neox", embed_scale="sqrt_d", qk_norm=True, post_norms=True, act="gelu",
                               swa_pattern=6, bidirectional=True, swa_rope_file=True),
    # hybrids (recurrent_spec.py, model/recurrent_layer.py)
    # Qwen3.5: 3 of 4 layers gated delta-net (model/delta_net.py), the rest gated attention; its
    # interleaved M-RoPE is neox rope for text (spec_keys.text_still_pairs)
    "qwen35": ArchDef(rope_mode="neox", qk_norm=True, ffn_norm="post_attention_norm", hybrid="gdn", attn_gate=True,
                      mrope="imrope"),
    # Qwen3.5 MoE: the same layers, every FFN routed (softmax, top-k, renormalized) plus a shared
    # expert behind a sigmoid gate (qwen2moe's)
    "qwen35moe": ArchDef(rope_mode="neox", qk_norm=True, ffn_norm="post_attention_norm", hybrid="gdn",
                         attn_gate=True, moe_norm=True, mrope="imrope"),
    # LFM2: short gated convolutions (model/short_conv.py) where attention.head_count_kv is 0, the
    # others attention with per-head q/k norms; the final norm is named token_embd_norm
    "lfm2": ArchDef(rope_mode="neox", qk_norm=True, hybrid="shortconv", out_norm="token_embd_norm", swa_all=True),
    # LFM2-MoE (LFM2-8B-A1B): lfm2's layers, a MoE FFN from layer `leading_dense_block_count` on, routed
    # by sigmoid, chosen with a per-expert selection bias (exp_probs_b), the k weights renormalized
    "lfm2moe": ArchDef(rope_mode="neox", qk_norm=True, hybrid="shortconv", out_norm="token_embd_norm", swa_all=True,
                       moe_norm=True, moe_gating="sigmoid", moe_keys=True),
    # Granite 4.0-H: Mamba-2 layers (model/mamba2.py) where attention.head_count_kv is 0, attention
    # layers without rope where rope.scaling.finetuned is false (the converter writes so), granite's
    # multipliers, a MoE (softmax, top-k, renormalized) plus a shared expert, or a dense FFN
    "granitehybrid": ArchDef(embed_scale="metadata", multipliers=True, hybrid="mamba2", moe_norm=True,
                             rope_switch=True),
    # Nemotron-H (src/models/nemotron-h.cpp): each layer one block behind its attn_norm: Mamba-2
    # (granitehybrid's) where head_count_kv and feed_forward_length are 0, attention without rope where
    # only feed_forward_length is, else an MLP alone (up, squared ReLU, down; its norm is attn_norm)
    "nemotron_h": ArchDef(hybrid="mamba2", no_rope_step=1, act="relu2", single_blocks=True, ffn_norm="attn_norm",
                          eps_layer_norm=True),
    # Nemotron 3 (src/models/nemotron-h.cpp's MoE branch): the same layers, the FFN blocks a MoE routed
    # by sigmoid with a selection bias (exp_probs_b), weights renormalized and scaled as the file says,
    # ungated squared-ReLU experts, plus an ungated squared-ReLU shared expert
    "nemotron_h_moe": ArchDef(hybrid="mamba2", no_rope_step=1, act="relu2", single_blocks=True, ffn_norm="attn_norm",
                              eps_layer_norm=True, moe_gating="sigmoid", moe_act="relu2", moe_file_weights=True,
                              moe_latent=True),
    # Falcon-H1 (src/models/falcon-h1.cpp): every layer attention (neox rope) and a Mamba-2 mixer side by
    # side on the same attn_norm'd input, (attn + ssm) + x, then a SwiGLU FFN; Falcon's muP multipliers
    # are folded into the weights by the converter; no group norm where the file has no ssm_norm
    "falcon-h1": ArchDef(rope_mode="neox", hybrid="mamba2", parallel_mixers=True),
    # src/models/deepseek2.cpp (DeepSeek-V2/V2.5/V3/R1, Kimi K2, Moonlight, GLM-4.7-Flash, GigaChat3): MLA
    # (mla_spec.py), leading dense layers, then experts routed as the file says (softmax, or sigmoid with
    # a selection bias), weights renormalized and scaled as it says, plus ungated shared experts
    "deepseek2": ArchDef(mla=True, moe_gating="file", moe_keys=True, moe_file_weights=True, moe_shared_count=True),
    # mixture of experts (moe_spec.py, moe.py): what llama.cpp's src/models/<arch>.cpp passes to build_moe_ffn
    "qwen3moe": ArchDef(rope_mode="neox", qk_norm=True, moe_norm=True),
    "qwen2moe": ArchDef(qkv_bias=True, rope_mode="neox"),
    "olmoe": ArchDef(rope_mode="neox", qk_norm=True, qk_norm_full=True),
    "granitemoe": ArchDef(embed_scale="metadata", multipliers=True, moe_norm=True, rope_switch=True),
    # llama.cpp's LLM_ARCH_OPENAI_MOE (src/models/openai-moe.cpp): every other layer windowed (pattern 2,
    # the global rope base), q/k/v/o biases, sinks, biased router, top-k then softmax, clamped SwiGLU
    "gpt-oss": ArchDef(qkv_bias=True, rope_mode="neox", swa_pattern=2, swa_rope_global=True, swa_rope_file=True,
                       moe_gating="softmax_weight",
                       moe_act="swiglu_oai", out_bias=True, sinks=True, ffn_norm="post_attention_norm"),
}
