"""Make tests/fixtures/archs/ MoE cases: tiny random Hugging Face MoE models converted by llama.cpp's
own `convert_hf_to_gguf.py`, and llama-server's outputs on them (the format of make_arch_fixtures.py).

Run once (it needs the llama.cpp peer build and its converter's dependencies, `convdeps`; the tests
only read what it writes):

    .venv/bin/python playground/make_moe_fixtures.py [NAME ...] [--size big --out DIR --no-ref]

Each case (`CASES`) is a transformers config (Qwen3MoeForCausalLM, OlmoeForCausalLM,
GraniteMoeForCausalLM, Qwen2MoeForCausalLM, GptOssForCausalLM: its experts written as MXFP4 blocks,
as gpt-oss ships them, so the fixture's experts are GGUF MXFP4; and dense ones, checked as the
converter writes them: Ministral3ForCausalLM, Olmo3ForCausalLM, Glm4ForCausalLM, Ernie4_5ForCausalLM,
SeedOssForCausalLM, Exaone4ForCausalLM, and the hybrids Qwen3_5ForCausalLM: gated delta net and full attention,
converted with `--no-mtp`, as is its MoE, Qwen3_5MoeForCausalLM, and Lfm2ForCausalLM: short convolutions and
attention) with random weights (seeded; norm weights away from 1, so a norm read in the wrong place shows)
and the tiny vocabulary of tests/tiny_gguf.py as a Hugging Face byte-level BPE tokenizer (same ids:
307-309 are the specials, so the arch fixture test reads these files like the others). The converter
runs in a child Python with patches: its sentencepiece attempt fails as "no tokenizer.model" (it is
not installed there), and its pre-tokenizer check (a hash of how a *known* model's tokenizer splits a
test text) is answered "default", which a made-up vocabulary cannot match; prompts are token ids, so nothing reads it.
GLM-4's and ERNIE's own vocabulary steps (chat specials, a sentencepiece model) are replaced by the
plain byte-level BPE one for the same reason.

`--size big` makes the speed model of docs/performance.md ("Issue 38: MoE"): d_model 512, 16
experts (4 used), 8 layers, the Qwen3 tokenizer-free vocabulary padded to 32000, written F32
to --out (then requantized with llama-quantize: Q4_K_M, or MXFP4_MOE for gpt-oss, whose experts
are MXFP4 already), no reference run. `qwen35 --size big` is Qwen3.5-0.8B's own shape instead
(BIG_CASE, BIG_OWN: 24 layers, d_model 1024, its 248320-entry vocabulary size), to time a real-size hybrid;
`lfm2 --size big` likewise is LFM2-350M's (16 layers, d_model 1024, FF 4608, 65536-entry vocabulary);
`granitehybrid_dense --size big` a Granite 4.0-H-350M-like shape, `nemotron_h --size big` a
Nemotron-H-0.5B-like one, `nemotron_h_moe --size big` the same with MoE blocks, and `falcon_h1 --size big`
Falcon-H1-0.5B's shape (BIG_CASE's comments).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "playground"))
from make_arch_fixtures import OUT, run_llama  # noqa: E402
from tiny_gguf import tiny_vocab  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
TREE = CACHE / "slotserver-peer" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
DEPS = CACHE / "slotserver-models" / "convdeps"

TINY = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=512,
            vocab_size=310, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0)
CASES: dict[str, tuple[str, dict]] = {
    # softmax, top-k, renormalized (llama.cpp always renormalizes qwen3moe); per-head q/k norms, neox
    "qwen3moe": ("Qwen3MoeForCausalLM", dict(head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                             intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1,
                                             mlp_only_layers=[])),
    # softmax, top-k, not renormalized; q/k RMSNorm over the whole projection (not per head; llama.cpp
    # sizes attn_k_norm as n_embd: no GQA, as OLMoE-1B-7B)
    "olmoe": ("OlmoeForCausalLM", dict(num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, intermediate_size=32,
                                       norm_topk_prob=False,
                                       clip_qkv=None)),
    # top-k then softmax over the selected (= softmax, top-k, renormalized); granite's multipliers
    "granitemoe": ("GraniteMoeForCausalLM", dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32,
                                                 embedding_multiplier=3.0, residual_multiplier=0.5,
                                                 attention_multiplier=0.2, logits_scaling=1.5)),
    # softmax, top-k, not renormalized; a shared expert behind a sigmoid gate; q/k/v biases
    "qwen2moe": ("Qwen2MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=64, intermediate_size=64,
                                             norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])),
    # top-k of the biased router logits, softmax over the k; experts in MXFP4 (the HF checkpoint's own
    # blocks, mxfp4_experts) with gate/up/down biases and the clamped SwiGLU; attention sinks, q/k/v/o
    # biases, every other layer windowed (6 cells: shorter than the prompts), gpt-oss's yarn rope
    "gpt-oss": ("GptOssForCausalLM", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                          num_hidden_layers=4, sliding_window=6, rope_parameters=dict(
                                              rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                              beta_slow=1.0, truncate=False, original_max_position_embeddings=4096))),
    # dense architectures whose converter writes keys of its own (not MoE, but made the same way):
    # Ministral 3's yarn (mscale_all_dim -> yarn_log_multiplier) and q temperature
    # (llama_4_scaling_beta -> attention.temperature_scale), past an original context of 8
    "ministral3": ("Ministral3ForCausalLM", dict(head_dim=8, intermediate_size=64, rope_parameters=dict(
        rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=8, beta_fast=16.0,
        beta_slow=2.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.5))),
    # OLMo 3: windows on 3 of 4 layers, no pre-norms, q/k norms over the whole projection; this config's
    # sliding rope_theta (HF's default 500000, the full layers' 10000) is written as freq_base_swa,
    # which llama.cpp's olmo2 graph does not read (real OLMo 3 files have one theta for both)
    "olmo3_hf": ("Olmo3ForCausalLM", dict(intermediate_size=64, num_hidden_layers=5, sliding_window=5)),
    # GLM-4-0414: pre- and post-norms, q/k/v biases, gate|up in one ffn_up, half the head rotated (pairs)
    "glm4": ("Glm4ForCausalLM", dict(head_dim=8, intermediate_size=64, attention_bias=True, partial_rotary_factor=0.5,
                                     pad_token_id=None)),
    # ERNIE 4.5 (dense): llama's block
    "ernie4_5": ("Ernie4_5ForCausalLM", dict(head_dim=8, intermediate_size=64, use_bias=False)),
    # Seed-OSS: q/k/v biases, NEOX rope, the FFN's pre-norm named post_attention_norm
    "seed_oss": ("SeedOssForCausalLM", dict(head_dim=8, intermediate_size=64, attention_bias=True,
                                            attention_out_bias=False)),
    # EXAONE 4.0: no pre-norms, post-norms, per-head q/k norms; 2 layers: no windows (llama.cpp windows
    # only a 64-layer file, the 32B)
    "exaone4": ("Exaone4ForCausalLM", dict(head_dim=8, intermediate_size=64, sliding_window=None,
                                           layer_types=["full_attention"] * 2)),
    # the 32B's shape at d_model 16: 64 layers, windows of 5 on 3 of 4 (LLLG), the full layers unrotated
    "exaone4_64": ("Exaone4ForCausalLM", dict(hidden_size=16, head_dim=4, intermediate_size=32, num_hidden_layers=64,
                                              sliding_window=5, sliding_window_pattern=4)),
    # Qwen3.5 (dense): gated delta net (linear attention) on 3 of 4 layers (LLLF), gated full attention
    # (q|gate in one attn_q, per-head q/k norms) on the 4th with a quarter of the head rotated (4 dims,
    # interleaved mrope sections [1, 1, 0]: text positions make it plain neox); (1 + w) norms, which the
    # converter writes as w + 1; 4 value heads on 2 key heads, reordered by the converter (grouped -> tiled)
    "qwen35": ("Qwen3_5ForCausalLM", dict(num_hidden_layers=4, head_dim=16, intermediate_size=64,
                                          linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                          linear_num_key_heads=2, linear_num_value_heads=4,
                                          rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                               partial_rotary_factor=0.25, mrope_section=[1, 1, 0],
                                                               mrope_interleaved=True))),
    # as qwen35 with as many value heads as key heads (no reordering), tied embeddings and 5 layers
    # (LLLFL: the last is linear attention)
    "qwen35_eq": ("Qwen3_5ForCausalLM", dict(num_hidden_layers=5, head_dim=16, intermediate_size=64,
                                             tie_word_embeddings=True,
                                             linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                             linear_num_key_heads=2, linear_num_value_heads=2,
                                             rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                  partial_rotary_factor=0.25, mrope_section=[1, 1, 0],
                                                                  mrope_interleaved=True))),
    # Qwen3.5 MoE: qwen35's layers (LLLF, same linear attention and rope) with every FFN a MoE block:
    # softmax, top-k, always renormalized (transformers has no norm_topk_prob / decoder_sparse_step /
    # mlp_only_layers here), plus a shared expert behind a sigmoid gate (ffn_gate_inp_shexp)
    "qwen35moe": ("Qwen3_5MoeForCausalLM", dict(num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=3,
                                                moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                                linear_conv_kernel_dim=4, linear_key_head_dim=8,
                                                linear_value_head_dim=8, linear_num_key_heads=2,
                                                linear_num_value_heads=4,
                                                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                     partial_rotary_factor=0.25,
                                                                     mrope_section=[1, 1, 0], mrope_interleaved=True))),
    # LFM2: gated short convolutions (in_proj -> b|c|x, c * conv(b * x) over 3 taps, no conv bias) on 3 of 5
    # layers, attention with per-head q/k norms on layers 2 and 4 (head_count_kv 0 on the conv layers), neox
    # rope; the final norm is HF's embedding_norm (token_embd_norm); FF dim 64 as given (no auto-adjust)
    "lfm2": ("Lfm2ForCausalLM", dict(num_hidden_layers=5, intermediate_size=64, norm_eps=1e-6, conv_L_cache=3,
                                     conv_bias=False, block_auto_adjust_ff_dim=False,
                                     layer_types=["conv", "conv", "full_attention", "conv", "full_attention"])),
    # LFM2-MoE (LFM2-8B-A1B's architecture): lfm2's layers, the first 2 with a dense FFN and the rest a MoE
    # block routed by sigmoid (llama.cpp's SIGMOID gating), selected by probability plus a per-expert bias
    # (expert_bias -> exp_probs_b, which leaves the weights unbiased), the k weights renormalized; tied
    # embeddings (the converter maps no lm_head for it, as LFM2-8B-A1B has none)
    "lfm2moe": ("Lfm2MoeForCausalLM", dict(num_hidden_layers=5, intermediate_size=96, moe_intermediate_size=64,
                                           num_experts=8, num_experts_per_tok=3, num_dense_layers=2, norm_eps=1e-6,
                                           tie_word_embeddings=True,
                                           conv_L_cache=3, conv_bias=False, use_expert_bias=True,
                                           layer_types=["conv", "conv", "full_attention", "conv", "full_attention"])),
    # Granite 4.0-H (granitehybrid): Mamba-2 layers (in_proj -> z | x B C | dt, a causal convolution with a
    # bias, the selective scan with per-head decay, D skip, silu(z) gate, group RMSNorm) on 3 of 5 layers,
    # attention without rope on the others (the converter writes rope.scaling.finetuned false), granite's
    # multipliers, every FFN a MoE (softmax, top-k, renormalized) plus a shared expert
    "granitehybrid": ("GraniteMoeHybridForCausalLM", dict(
        layer_types=["mamba", "mamba", "attention", "mamba", "attention"], num_hidden_layers=5,
        mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
        mamba_conv_bias=True, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
        shared_intermediate_size=96, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
        logits_scaling=1.5, vocab_size=312)),   # the converter pads a Mamba-2 vocabulary to a multiple of 8
    # Granite 4.0-H-Micro's form: the same layers with a dense FFN (no experts: the shared MLP is the FFN)
    "granitehybrid_dense": ("GraniteMoeHybridForCausalLM", dict(
        layer_types=["mamba", "attention", "mamba", "mamba"], num_hidden_layers=4,
        mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
        mamba_conv_bias=True, num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=64,
        intermediate_size=64,
        embedding_multiplier=2.0,
        residual_multiplier=0.7, attention_multiplier=0.25, logits_scaling=2.0, vocab_size=312)),
    # Nemotron-H (llama.cpp's nemotron_h): each layer one block behind its own RMSNorm (attn_norm): a
    # Mamba-2 mixer (M: granitehybrid's, 2 groups), attention without rope (*) or a plain MLP (-:
    # up, squared ReLU, down); the converter reads the block types from hybrid_override_pattern
    "nemotron_h": ("NemotronHForCausalLM", dict(
        layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mlp"], head_dim=16, intermediate_size=64,
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4, expand=2,
        use_conv_bias=True, layer_norm_epsilon=1e-5, vocab_size=312)),
    # Nemotron 3 (llama.cpp's nemotron_h_moe): the same one-block layers, the FFN blocks (E) a MoE routed
    # by sigmoid with a selection bias (e_score_correction_bias, drawn as lfm2moe's), the 2 weights
    # renormalized and scaled by 2.5, ungated squared-ReLU experts plus a squared-ReLU shared expert
    "nemotron_h_moe": ("NemotronHForCausalLM", dict(
        layers_block_type=["mamba", "moe", "attention", "moe", "mamba", "moe"], head_dim=16,
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4, expand=2,
        use_conv_bias=True, layer_norm_epsilon=1e-5, vocab_size=312, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=64, n_shared_experts=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1, topk_group=1)),
    # Falcon-H1 (llama.cpp's falcon-h1): every layer attention (neox rope) and a Mamba-2 mixer (2 groups, no
    # group norm: mamba_rms_norm false) side by side on one attn_norm'd input, summed, then a SwiGLU FFN;
    # Falcon's muP multipliers (away from 1 here) are folded into the weights by the converter
    "falcon_h1": ("FalconH1ForCausalLM", dict(
        num_hidden_layers=3, head_dim=16, intermediate_size=64, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_conv_bias=True,
        mamba_rms_norm=False, embedding_multiplier=2.0, lm_head_multiplier=0.5, attention_in_multiplier=0.8,
        attention_out_multiplier=1.2, key_multiplier=0.9, ssm_in_multiplier=1.1, ssm_out_multiplier=0.7,
        ssm_multipliers=[1.0, 0.9, 1.1, 0.8, 1.2], mlp_multipliers=[0.9, 1.1])),
    # DeepSeek-V3 / R1 / Kimi / GLM-4.7-Flash's form (llama.cpp's deepseek2, MLA converted for the absorbed
    # path: q through a low-rank q_a -> norm -> q_b, K/V one 16-wide latent plus an 8-wide shared rope key,
    # wk_b / wv_b per head): a leading dense layer, then experts routed by sigmoid with a selection bias
    # (e_score_correction_bias), the 3 weights renormalized and scaled by 2.5, one shared expert; YaRN with
    # DeepSeek's mscale (mscale_all_dim 1: the q.k scale grows with the factor)
    "deepseek2": ("DeepseekV3ForCausalLM", dict(
        num_hidden_layers=3, num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16,
        n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=24,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))),
    # DeepSeek-V2-Lite / Moonlight's form: q straight from the normed rows (no q_lora_rank: llama.cpp's
    # "lite" files have 26 or 27 layers, so this one has 26), softmax routing without renormalization,
    # two shared experts, YaRN with V2's mscale 0.707 (which cancels on cos/sin and scales q.k); 16 wide,
    # so that 26 layers stay under the fixtures' 1 MB
    "deepseek2_lite": ("DeepseekV2ForCausalLM", dict(
        hidden_size=16, num_hidden_layers=26, num_key_value_heads=4, intermediate_size=32, moe_intermediate_size=8,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
        routed_scaling_factor=1.0, norm_topk_prob=False, kv_lora_rank=16, q_lora_rank=None,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, topk_method="greedy",
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
                             mscale=0.707, mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0))),
}
# Nemotron 3 Super's form: the experts in a 16-wide latent space (fc1/fc2_latent_proj around them)
CASES["nemotron_h_latent"] = ("NemotronHForCausalLM", CASES["nemotron_h_moe"][1] | dict(moe_latent_size=16))
# the same with the Mamba-2 group norm (mamba_rms_norm: the file has ssm_norm), 2 groups
CASES["falcon_h1_norm"] = ("FalconH1ForCausalLM", CASES["falcon_h1"][1] | dict(mamba_rms_norm=True))
# converter options per transformers class (Qwen3.5: no MTP layers here, which the converter otherwise
# requires to find in the checkpoint)
CONVERT_ARGS = {"Qwen3_5ForCausalLM": ["--no-mtp"],
                "Qwen3_5MoeForCausalLM": ["--no-mtp"]}
# a seed whose greedy ids avoid the special tokens (the test bans them, llama-server picks a CONTROL
# token <|im_start|> as any other: the first granitemoe seed started with it, the first lfm2 one took
# it second)
SEED_OFFSET = {"granitemoe": 1, "lfm2": 1, "nemotron_h": 1, "falcon_h1": 1, "nemotron_h_latent": 1, "deepseek2_lite": 1}
BIG = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=8, head_dim=64, vocab_size=32000,
           num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512, intermediate_size=1024)
# per case where its config names these differently (gpt-oss: experts of width intermediate_size, the
# real model's 128-cell window and a larger GQA group)
BIG_CASE = {"gpt-oss": dict(num_local_experts=16, intermediate_size=512, sliding_window=128, num_key_value_heads=2),
            # Qwen3.5-0.8B's own shape (its config.json's text_config, no MTP layer), random weights: a whole
            # config, not merged with BIG (see BIG_OWN); 24 layers LLLF x 6 (layer_types' default, every
            # 4th full), the real 248320-entry vocabulary's size (the tiny tokenizer, padded by the converter)
            "qwen35": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
                           head_dim=256, intermediate_size=3584, linear_num_key_heads=16, linear_num_value_heads=16,
                           linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                           vocab_size=248320, tie_word_embeddings=True, max_position_embeddings=262144,
                           rms_norm_eps=1e-6, rope_theta=10000000.0,
                           rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                                mrope_section=[11, 11, 10], mrope_interleaved=True)),
            # LFM2-350M's own shape (its config.json), random weights, a whole config (BIG_OWN): 16 layers,
            # attention on 2, 5, 8, 10, 12, 14, short convolutions on the other 10; FF 6656 auto-adjusted
            # (2/3, x1.0, up to a multiple of 256) to 4608; the real 65536-entry vocabulary's size, tied
            "lfm2": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
                         layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
                         conv_L_cache=3, conv_bias=False, intermediate_size=6656, block_auto_adjust_ff_dim=True,
                         block_ffn_dim_multiplier=1.0, block_multiple_of=256, vocab_size=65536,
                         tie_word_embeddings=True, max_position_embeddings=128000, norm_eps=1e-5, rms_norm_eps=1e-5,
                         rope_theta=1000000.0, rope_parameters=dict(rope_type="default", rope_theta=1000000.0))}
BIG_CASE["granitehybrid_dense"] = dict(
    # a Granite 4.0-H-350M-like shape (not its published config: 768 wide, 32 layers of which 4 attention
    # (12 heads, 4 KV heads), Mamba-2 with 48 heads of 32, N 128, one group; a dense FFN of 2048; a
    # 100352-entry vocabulary, tied), random weights, a whole config (BIG_OWN)
    hidden_size=768, num_hidden_layers=32, num_attention_heads=12, num_key_value_heads=4,
    layer_types=["attention" if i in (9, 18, 27, 31) else "mamba" for i in range(32)],
    mamba_n_heads=48, mamba_d_head=32, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
    mamba_conv_bias=True, num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=2048,
    intermediate_size=2048, embedding_multiplier=12.0, residual_multiplier=0.246, attention_multiplier=0.0078125,
    logits_scaling=3.0, vocab_size=100352, tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-5)
BIG_CASE["nemotron_h"] = dict(
    # a Nemotron-H-like shape at ~0.5B (not a published config): 1024 wide, 28 layers "M-M-M*-" x 4 (12
    # Mamba-2 of 32 heads of 64, N 128, 8 groups; 12 MLPs of 4096; 4 attention layers of 8 heads of 128,
    # 2 KV heads), Nemotron's 131072-entry vocabulary, untied
    layers_block_type=["mamba", "mlp", "mamba", "mlp", "mamba", "attention", "mlp"] * 4, hidden_size=1024,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128, intermediate_size=4096, mamba_num_heads=32,
    mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4, expand=2, use_conv_bias=True,
    vocab_size=131072, max_position_embeddings=8192, tie_word_embeddings=False, rms_norm_eps=1e-5,
    layer_norm_epsilon=1e-5)
BIG_CASE["nemotron_h_moe"] = BIG_CASE["nemotron_h"] | dict(
    # the same shape with Nemotron 3's MoE blocks in place of the MLPs: 32 experts of 512, 4 used, a shared
    # expert of 1024, weights renormalized and scaled by 2.5 (Nemotron 3 Nano: 128 of 1856, 6 used)
    layers_block_type=["mamba", "moe", "mamba", "moe", "mamba", "attention", "moe"] * 4, n_routed_experts=32,
    num_experts_per_tok=4, moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024, n_shared_experts=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1, topk_group=1)
BIG_CASE["falcon_h1"] = dict(
    # Falcon-H1-0.5B's shape as published (36 layers, 1024 wide; attention 8 heads of 64, 2 KV heads; Mamba-2
    # 24 heads of 64 (inner 1536), N 128, one group, no group norm; SwiGLU FFN of 2048; a 32784-entry
    # vocabulary, untied), random weights, its multipliers at 1
    num_hidden_layers=36, hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
    intermediate_size=2048, mamba_d_ssm=1536, mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1,
    mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_conv_bias=True, mamba_rms_norm=False,
    vocab_size=32784, max_position_embeddings=16384, tie_word_embeddings=False, rms_norm_eps=1e-5,
    rope_theta=100000000000.0)
BIG_CASE["deepseek2"] = dict(
    # GLM-4.7-Flash's layer shapes (llama.cpp's deepseek2: 2048 wide, 20 heads, q_lora 768, latent 512, nope
    # 192 + rope 64, v 256, dense FFN 10240, experts of 1536, sigmoid routing, 4 used + 1 shared, scale 1.8),
    # 6 of its 47 layers and 16 of its 64 experts, a 32000-entry vocabulary: a speed model of the latent
    # attention and its routing (an F32 file of ~4 GB; requantize with llama-quantize). A "lite" shape (no
    # q_lora) is no speed model: llama.cpp takes a file without q_lora_rank for lite only at 26-27 layers
    hidden_size=2048, num_hidden_layers=6, num_attention_heads=20, num_key_value_heads=20, intermediate_size=10240,
    moe_intermediate_size=1536, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, kv_lora_rank=512,
    q_lora_rank=768, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, vocab_size=32000,
    routed_scaling_factor=1.8, max_position_embeddings=202752, rope_parameters=dict(rope_type="default",
                                                                                   rope_theta=1000000.0))
# cases whose BIG_CASE entry is the whole big config (over TINY and the case's own), without BIG
BIG_OWN = {"qwen35", "lfm2", "granitehybrid_dense", "nemotron_h", "nemotron_h_moe", "falcon_h1", "deepseek2"}

CONVERT = """
import sys
sys.path.insert(0, {tree!r}); sys.path.insert(0, {tree!r} + "/gguf-py")
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"   # a made-up vocabulary: see the docstring
def no_spm(self):   # no tokenizer.model here: the BPE path, also without the sentencepiece package
    raise FileNotFoundError("tokenizer.model")
base.TextModel._create_vocab_sentencepiece = no_spm
from conversion import glm   # GLM-4's vocabulary step looks up its chat specials, which the tiny one lacks
glm.Glm4Model.set_vocab = lambda self: self._set_vocab_gpt2()
from conversion import ernie   # ERNIE's asks for a sentencepiece model
ernie.Ernie4_5Model.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = ["convert_hf_to_gguf.py", {hf!r}, "--outfile", {out!r}, "--outtype", "f32", *{args!r}]
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """tests/tiny_gguf.py's vocabulary as a Hugging Face byte-level BPE tokenizer (ids kept)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tokens, merges, types = tiny_vocab()
    normal = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    bpe = models.BPE(vocab=normal, merges=[tuple(m.split(" ")) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [t for i, t in enumerate(tokens) if types[i] != 1]
    tok.add_special_tokens(specials)   # in order: ids 307.. as in the GGUF fixtures
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[2],
                                   pad_token=specials[0])
    assert [fast.convert_tokens_to_ids(s) for s in specials] == list(range(len(normal), len(tokens)))
    fast.save_pretrained(folder)


def write_hf(folder: Path, cls_name: str, config: dict, seed: int) -> None:
    """A random model of `cls_name` saved as safetensors (float32), norm weights drawn around 1."""
    import torch
    import transformers
    torch.manual_seed(seed)
    model_cls = getattr(transformers, cls_name)
    cfg = model_cls.config_class(**config)
    model = model_cls(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("linear_attn.A_log", "linear_attn.dt_bias")):   # gated delta net: decays in (0, 1)
                p.uniform_(0.0, 1.0)   # A = exp(A_log) in 1..e, dt_bias 0..1: exp(-A softplus(a + dt_bias))
            elif p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif p.dim() >= 2:
                p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
            elif "bias" in name:
                p.normal_(0, 0.3)
        for name, p in model.named_parameters():
            if name.endswith("sinks"):   # learned per-head logits: in the scores' range, so they matter
                p.normal_(0, 1.0)
        for name, b in model.named_buffers():
            if name.endswith(("expert_bias", "e_score_correction_bias")):   # lfm2moe's, nemotron_h_moe's selection
                b.normal_(0, 0.3)   # bias (a buffer, zeros by default): as large as the sigmoid probabilities'
                                    # spread, so it moves selections
    model.save_pretrained(folder, safe_serialization=True)
    if cls_name == "GptOssForCausalLM":
        mxfp4_experts(folder)
    if cls_name == "GraniteMoeHybridForCausalLM":   # transformers saves its own layer names; the converter
        path = folder / "config.json"               # looks for Granite's ("attention", else a Mamba-2 layer)
        config = json.loads(path.read_text())
        config["layer_types"] = ["attention" if t in ("attention", "full_attention") else "mamba"
                                 for t in config["layer_types"]]
        path.write_text(json.dumps(config, indent=2))
    if cls_name == "DeepseekV3ForCausalLM":   # DeepSeek-V3's config.json names its router (transformers
        path = folder / "config.json"          # hardcodes it and saves no key): the converter reads it
        saved = json.loads(path.read_text())
        saved |= {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
        path.write_text(json.dumps(saved, indent=2))
    if cls_name == "NemotronHForCausalLM" and not config.get("n_routed_experts"):
        nemotron_pattern(folder)


def nemotron_pattern(folder: Path) -> None:
    """The saved NemotronH config as NVIDIA's checkpoints write it: the block types as the pattern
    string the converter reads (M Mamba-2, * attention, - MLP), no MoE keys (transformers saves its
    defaults; the converter takes any `num_experts_per_tok` for nemotron_h_moe). Its model_type
    is one transformers does not know, so that the converter reads config.json as written rather
    than transformers' config with those defaults back (NVIDIA's remote-code checkpoints did too)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    signs = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-"}
    config["hybrid_override_pattern"] = "".join(signs[t] for t in config.pop("layers_block_type"))
    config["num_hidden_layers"] = len(config["hybrid_override_pattern"])   # a property in transformers
    for key in ("num_experts_per_tok", "n_routed_experts", "moe_intermediate_size", "n_shared_experts",
                "moe_shared_expert_intermediate_size", "n_group", "topk_group"):
        config.pop(key, None)
    config["model_type"] = "nemotron_h_dense"
    path.write_text(json.dumps(config, indent=2))


FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # E2M1 magnitudes of nibbles 0-7 (8-15: negated)


def mxfp4_experts(folder: Path) -> None:
    """Rewrite a saved GptOss checkpoint's float experts as the MXFP4 blocks gpt-oss ships
    (`*_blocks` [E, out, in/32, 16] two nibbles a byte, low first; `*_scales` [E, out, in/32] E8M0
    biased by 127; quantization_config mxfp4), which llama.cpp's converter repacks into GGUF MXFP4."""
    import torch
    from safetensors.torch import load_file, save_file
    path = folder / "model.safetensors"
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors.pop(name).transpose(-1, -2).contiguous()                    # [E, out, in]
        blocks = w.reshape(*w.shape[:2], -1, 32)
        amax = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        e = torch.ceil(torch.log2(amax / 6.0))                                  # |x| / 2^e <= 6
        mags = torch.tensor(FP4)
        x = blocks / torch.exp2(e)
        code = (x.abs().unsqueeze(-1) - mags).abs().argmin(-1) + 8 * (x < 0)   # nearest E2M1, sign bit 8
        code = code.to(torch.uint8)
        tensors[name + "_blocks"] = (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous()
        tensors[name + "_scales"] = (e.squeeze(-1) + 127).to(torch.uint8).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": []}
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def convert(hf: Path, out: Path, args: list[str] = ()) -> Path:
    """llama.cpp's converter in a child Python on the peer tree (its gguf-py) and `convdeps`."""
    code = CONVERT.format(tree=str(TREE), hf=str(hf), out=str(out), args=list(args))
    env = dict(os.environ, PYTHONPATH=str(DEPS))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def make(name: str, out_dir: Path, big: bool, reference: bool) -> None:
    cls_name, extra = CASES[name]
    config = TINY | extra | ((BIG_CASE[name] if name in BIG_OWN else BIG | BIG_CASE.get(name, {})) if big else {})
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        write_hf(hf, cls_name, config, seed=sum(map(ord, name)) + SEED_OFFSET.get(name, 0))
        write_tokenizer(hf, config["vocab_size"])
        gguf = convert(hf, out_dir / f"{name}{'-big' if big else ''}.gguf", CONVERT_ARGS.get(cls_name, []))
    print(f"{name}: {gguf} {gguf.stat().st_size} bytes")
    if reference:
        rows = run_llama(gguf)
        gguf.with_suffix(".json").write_text(json.dumps(rows, indent=None) + "\n")
        gguf.with_suffix(".log").unlink(missing_ok=True)
        print(f"  greedy {[r['generated_ids'][:6] for r in rows]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"cases (default: all of {', '.join(CASES)})")
    ap.add_argument("--size", choices=("tiny", "big"), default="tiny")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--no-ref", action="store_true", help="skip llama-server's reference outputs")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(CASES):
        make(name, args.out, args.size == "big", not args.no_ref and args.size == "tiny")


if __name__ == "__main__":
    main()
