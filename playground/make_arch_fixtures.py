"""Make tests/fixtures/archs/: a tiny random-weight GGUF per architecture and llama.cpp's outputs on it.

Run once (it needs the llama.cpp peer build; the tests only read what it writes):

    .venv/bin/python playground/make_arch_fixtures.py [NAME ...]

Each case (`CASES`) is a tiny F32 model from tests/tiny_gguf.py with every switch of its
architecture on and made to matter (a window shorter than the prompts, soft-caps inside the
logits' range, norm weights away from 1, a rope scaling whose blend touches the rotated dims).
llama-server runs it with an f32 KV cache; `POST /completion` with prompt token ids, temperature 0,
`ignore_eos`, `n_probs 8`, `n_predict` N gives the greedy ids and each step's top-8 log-probs (the
format of tests/fixtures/greedy_f32.json, plus `banned`: ids the greedy pick excludes, see `banned`). Writes `<name>.gguf` and `<name>.json` per case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from local_server import PEER, free_port, post, wait_healthy  # noqa: E402
from gguf_rewrite import rewrite  # noqa: E402
from tiny_gguf import bytes_to_unicode, write_gguf, write_tiny_gguf  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "archs"
CONTROL_DIR = ROOT / "tests" / "fixtures" / "control"   # control vectors: not *.gguf models of archs/
N_CTX, N_PREDICT = 256, 12
U32 = gguf.GGUFValueType.UINT32
ARR_I32 = gguf.GGUFValueType.ARRAY
SMALL = dict(d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, ctx_len=512, **{"tokenizer.ggml.pre": "default", "general.name": "tiny"})

def olmo2_weights(w: dict) -> dict:
    """tiny_gguf's weights as olmo2 has them: no pre-norms, q/k norms over the whole projections."""
    rng = np.random.default_rng(5)
    out = {k: v for k, v in w.items() if not k.endswith(("attn_norm.weight", "ffn_norm.weight"))}
    for name in [k for k in out if k.endswith(("attn_q.weight", "attn_k.weight"))]:
        rows = out[name].shape[0]
        out[name.replace(".weight", "_norm.weight")] = (1 + 0.3 * rng.standard_normal(rows)).astype(np.float32)
    return out


def ungated(w: dict) -> dict:
    """tiny_gguf's weights without the FFN gates (arcee, nemotron's dense layers: up, squared ReLU, down)."""
    return {k: v for k, v in w.items() if not k.endswith("ffn_gate.weight")}


CASES: dict[str, dict] = {
    "gemma3": dict(arch="gemma3", n_layers=6, head_dim=16, rope_base=1e6, features=("qk_norm", "post_norms"),
                   **{"gemma3.attention.sliding_window": (4, U32), "gemma3.final_logit_softcapping": 8.0}),
    "qwen3": dict(arch="qwen3", head_dim=16, features=("qk_norm",)),
    "gemma2": dict(arch="gemma2", head_dim=16, features=("post_norms",),
                   **{"gemma2.attention.sliding_window": (5, U32), "gemma2.attn_logit_softcapping": 2.0,
                      "gemma2.final_logit_softcapping": 6.0, "gemma2.rope.freq_base_swa": 500.0}),
    "phi3": dict(arch="phi3", n_kv_heads=4, features=("fused", "rope_factors"),
                 **{"phi3.rope.scaling.attn_factor": 1.2, "phi3.rope.scaling.original_context_length": (128, U32)}),
    "granite": dict(arch="granite", tied_embeddings=False,
                    **{"granite.embedding_scale": 3.0, "granite.residual_scale": 0.5, "granite.attention.scale": 0.2,
                       "granite.logit_scale": 1.5}),
    "qwen2_yarn": dict(arch="qwen2", qkv_bias=True,
                       **{"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
                          "qwen2.rope.scaling.original_context_length": (64, U32)}),
    "llama3_freqs": dict(arch="llama", features=("rope_freqs",), rope_base=500000.0),
    "llama_linear": dict(arch="llama", **{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}),
    # q/k/v biases in a llama file: llama.cpp's create_tensor_qkv loads them for any architecture
    "llama_bias": dict(arch="llama", qkv_bias=True),
    # 5 layers: layer 3 is smollm3's NoPE layer ((3 + 1) % 4 == 0), with rotated layers on both sides
    "smollm3": dict(arch="smollm3", n_layers=5, rope_base=2e6),
    # yarn with its log multiplier and betas, and the q temperature: an original context of 8 puts
    # every prompt past it (floor(pos / 8) = 0..3 over the 3-29 positions)
    "mistral3": dict(arch="mistral3", tied_embeddings=False, rope_base=1e6,
                     **{"mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 4.0,
                        "mistral3.rope.scaling.original_context_length": (8, U32),
                        "mistral3.rope.scaling.yarn_log_multiplier": 1.0, "mistral3.rope.scaling.yarn_beta_fast": 16.0,
                        "mistral3.rope.scaling.yarn_beta_slow": 2.0, "mistral3.attention.temperature_scale": 0.5}),
    "olmo2": dict(arch="olmo2", tied_embeddings=False, transform=olmo2_weights, features=("post_norms",)),
    # Qwen2-VL's M-RoPE sections over the 4 pairs of a head; Qwen3-VL's interleaved ones leave pair 7 of 8
    # unrotated for text (llama.cpp's 4th position is 0), as Qwen3-VL's [24, 20, 20, 0] leave pairs 61-62 of 64
    "qwen2vl": dict(arch="qwen2vl", qkv_bias=True, **{"qwen2vl.rope.dimension_sections": ([2, 1, 1, 0], ARR_I32)}),
    "qwen3vl": dict(arch="qwen3vl", head_dim=16, features=("qk_norm",),
                    **{"qwen3vl.rope.dimension_sections": ([4, 2, 2, 0], ARR_I32), "qwen3vl.n_deepstack_layers": (1, U32)}),
    # Hunyuan's q/k norms after the rope, the base stretched by its NTK alpha
    "hunyuan_dense": dict(arch="hunyuan-dense", head_dim=16, features=("qk_norm",),
                          **{"hunyuan-dense.rope.scaling.alpha": 50.0}),
    "internlm2": dict(arch="internlm2", tied_embeddings=False, rope_base=1e6),
    "exaone": dict(arch="exaone", features=("rope_freqs",), rope_base=1e6),
    "gemma": dict(arch="gemma", head_dim=16, **{"tokenizer.ggml.add_bos_token": True}),
    "arcee": dict(arch="arcee", features=("rope_freqs",), transform=ungated),
    # minicpm with its multipliers in the file, and with none (llama.cpp's defaults for them)
    "minicpm": dict(arch="minicpm", tied_embeddings=False,
                    **{"minicpm.embedding_scale": 6.0, "minicpm.residual_scale": 0.7, "minicpm.logit_scale": 2.5}),
    "minicpm_defaults": dict(arch="minicpm", n_layers=3),
    # OLMo 3: windows on 3 of 4 layers (5 layers: 0-2 and 4 windowed), plain rope there at the global
    # base (no freq_base_swa key), yarn on the full layer 3
    "olmo3": dict(arch="olmo2", n_layers=5, tied_embeddings=False, transform=olmo2_weights, rope_base=1e5,
                  features=("post_norms",),
                  **{"olmo2.attention.sliding_window": (5, U32), "olmo2.rope.scaling.type": "yarn",
                     "olmo2.rope.scaling.factor": 4.0, "olmo2.rope.scaling.original_context_length": (8, U32)}),
}

# a converted case's file under another architecture name, with keys added: (source case, arch, keys)
RENAMED: dict[str, tuple[str, str, dict]] = {
    "qwen3vlmoe": ("qwen3moe", "qwen3vlmoe", {"qwen3vlmoe.rope.dimension_sections": ([4, 2, 2, 0], ARR_I32)}),
    # Mixtral's kind: a llama file with experts (llama.cpp's llama graph renormalizes the top-k weights);
    # qwen3moe's converted file without its q/k norms
    "llama_moe": ("qwen3moe", "llama", {"llama.feed_forward_length": (32, U32)}),   # its experts' width
    # a granite file with experts: granite's graph renormalizes them too (granitemoe's file renamed)
    "granite_moe": ("granitemoe", "granite", {}),
}
NO_QK_NORM = {"llama_moe"}   # RENAMED cases whose q/k norm tensors are left out
# deepseek2 as converted before llama.cpp's absorbed MLA path (mid 2025): attn_kv_b, multi-head key and
# value lengths (nope + rope = 16, v 12), 4 KV heads; llama.cpp runs its multi-head branch on it
RENAMED["deepseek2_legacy"] = ("deepseek2", "deepseek2", {
    "deepseek2.attention.key_length": (16, U32), "deepseek2.attention.value_length": (12, U32),
    "deepseek2.attention.head_count_kv": (4, U32), "deepseek2.attention.key_length_mla": None,
    "deepseek2.attention.value_length_mla": None})


def mla_legacy(src: Path) -> dict[str, np.ndarray]:
    """Each layer's attn_kv_b [heads * (nope + v), rank] from its attn_k_b [heads, rank, nope] and
    attn_v_b [heads, v, rank] (the converter's split, undone: per head its nope rows, then its v rows)."""
    tensors = {t.name: np.asarray(t.data).reshape([int(n) for n in reversed(t.shape.tolist())])
               for t in gguf.GGUFReader(src).tensors if t.name.endswith(("attn_k_b.weight", "attn_v_b.weight"))}
    out = {}
    for name in [n for n in tensors if n.endswith("attn_k_b.weight")]:
        k_b, v_b = tensors[name], tensors[name.replace("attn_k_b", "attn_v_b")]
        rows = [np.concatenate([k_b[h].T, v_b[h]]) for h in range(k_b.shape[0])]
        out[name.replace("attn_k_b", "attn_kv_b")] = np.concatenate(rows)
    return out


# llama-server's rope flags (or --override-kv) over a case's file (cli/model_meta_args.py): <name>.json only, its rows
# naming the file ("model") and the flags ("flags"); windowed layers keep the file's rope (gemma3)
FLAGGED: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama_rope_flags": ("llama_bias", ("--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "64",
                                        "--rope-freq-base", "5000")),
    "qwen2_yarn_flags": ("qwen2_yarn", ("--rope-scale", "2", "--yarn-ext-factor", "0.5", "--yarn-beta-fast", "8",
                                        "--yarn-beta-slow", "2")),
    "qwen2_yarn_none": ("qwen2_yarn", ("--rope-scaling", "none")),
    "llama_linear_flags": ("llama_linear", ("--rope-scaling", "yarn", "--yarn-ext-factor", "0",
                                            "--yarn-attn-factor", "1.25")),
    "gemma3_rope_flags": ("gemma3", ("--rope-freq-base", "20000", "--rope-freq-scale", "0.5")),
    # windowed layers that take the flags (llama.cpp's graphs without get_rope_freq_base)
    "olmo3_rope_flags": ("olmo3", ("--rope-freq-base", "30000", "--rope-freq-scale", "0.25")),
    "exaone4_64_rope_flags": ("exaone4_64", ("--rope-freq-base", "50000", "--rope-freq-scale", "0.5")),
    "lfm2_swa_rope_flags": ("lfm2_swa", ("--rope-freq-base", "50000", "--rope-freq-scale", "0.5")),
    "exaone4_64_base_swa": ("exaone4_64", ("--override-kv", "exaone4.rope.freq_base_swa=float:500")),
    # older Hunyuan conversions wrote expert_count 1 for a dense model: no experts (llama.cpp's loader);
    # and a rope flag over the alpha-stretched base
    "hunyuan_dense_one_expert": ("hunyuan_dense", ("--override-kv", "hunyuan-dense.expert_count=int:1")),
    "hunyuan_dense_rope_flags": ("hunyuan_dense", ("--rope-freq-base", "30000", "--rope-freq-scale", "0.5")),
    # control vectors (control_vector below): two summed, one scaled; a layer range; a direction past the
    # last layer (never applied)
    "smollm3_cvec": ("smollm3", ("--control-vector", "cvec_a.gguf", "--control-vector-scaled", "cvec_b.gguf:-0.5")),
    "gemma3_cvec": ("gemma3", ("--control-vector-scaled", "cvec_c.gguf:1.5", "--control-vector-layer-range",
                               "2", "3")),
}
# control vector files the FLAGGED cases name: (layers with a direction, seed); width SMALL's d_model
CONTROL = {"cvec_a.gguf": (range(1, 6), 1), "cvec_b.gguf": (range(2, 4), 2), "cvec_c.gguf": (range(1, 7), 3)}


def control_vector(path: Path, layers: range, seed: int) -> None:
    """llama.cpp's control vector format: F32 `direction.N` of the model's width per layer N."""
    rng = np.random.default_rng(seed)
    write_gguf(path, "controlvector", {f"direction.{n}": (0.5 * rng.standard_normal(SMALL["d_model"])).astype(np.float32)
                                       for n in layers}, **{"controlvector.model_hint": "tiny",
                                                            "controlvector.layer_count": len(layers)})


def prompts(seed: int = 7) -> list[list[int]]:
    """Three prompts of ordinary (non-special) token ids: 3, 9 and 17 tokens long."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, n).tolist() for n in (3, 9, 17)]


def banned() -> list[int]:
    """Byte tokens of bytes >= 0x80 (GPT-2 byte order): llama-server reports no probabilities for a
    token that leaves its text as incomplete UTF-8, so greedy decoding never picks them here (a
    logit bias); the reported probabilities are the raw ones, these tokens included."""
    return [i for i, b in enumerate(bytes_to_unicode()) if b >= 0x80]


def run_llama(gguf: Path, flags: tuple[str, ...] = ()) -> list[dict]:
    """llama-server on `gguf` (f32 KV, one slot); the greedy completion of every prompt."""
    port = free_port()
    cmd = [str(PEER / "llama-server"), "-m", str(gguf), "--port", str(port), "-c", str(N_CTX), "-np", "1",
           "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", "2", "--no-warmup", *flags]
    env = dict(os.environ, LD_LIBRARY_PATH=str(PEER))
    with open(gguf.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        wait_healthy(port, f"llama-server on {gguf} (see {gguf.with_suffix('.log')})", proc, timeout_s=60)
        return [_complete(port, ids) for ids in prompts()]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _complete(port: int, ids: list[int]) -> dict:
    r = post(port, "/completion", {"prompt": ids, "n_predict": N_PREDICT, "temperature": 0, "ignore_eos": True,
                                   "n_probs": 8, "cache_prompt": False, "samplers": ["top_k"], "top_k": 1,
                                   "logit_bias": [[t, False] for t in banned()]}, timeout_s=120)
    steps = [{"id": p["id"], "top": [[t["id"], t["logprob"]] for t in p["top_logprobs"]]}
             for p in r["completion_probabilities"]]
    assert len(steps) == N_PREDICT, f"llama-server reported {len(steps)} of {N_PREDICT} steps"
    return {"prompt_ids": ids, "generated_ids": [s["id"] for s in steps], "banned": banned(), "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"cases to make (default: all of {', '.join(CASES | RENAMED | FLAGGED)})")
    names = ap.parse_args().names or list(CASES | RENAMED | FLAGGED)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name in FLAGGED:
            model, flags = FLAGGED[name]
            for cv in CONTROL:
                if any(f.startswith(cv) for f in flags):
                    control_vector(CONTROL_DIR / cv, *CONTROL[cv])
            paths = tuple(str(CONTROL_DIR / f) if f.split(":")[0] in CONTROL else f for f in flags)
            rows = [r | {"model": model, "flags": list(flags)} for r in run_llama(OUT / f"{model}.gguf", paths)]
            (OUT / f"{name}.json").write_text(json.dumps(rows, indent=None) + "\n")
            (OUT / f"{model}.log").unlink(missing_ok=True)
            print(f"{name}: {model} {' '.join(flags)}, greedy {[r['generated_ids'][:6] for r in rows]}")
            continue
        if name in RENAMED:
            source, arch, keys = RENAMED[name]
            drop = (lambda n, d, t: None if n.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) else (d, t)) \
                if name in NO_QK_NORM else None
            extra = mla_legacy(OUT / f"{source}.gguf") if name == "deepseek2_legacy" else None
            if extra:
                drop = lambda n, d, t: None if n.endswith(("attn_k_b.weight", "attn_v_b.weight")) else (d, t)  # noqa: E731
            gguf = rewrite(OUT / f"{source}.gguf", OUT / f"{name}.gguf", keys, drop, extra, arch=arch)
        else:
            gguf = write_tiny_gguf(OUT / f"{name}.gguf", seed=sum(map(ord, name)), **(SMALL | CASES[name]))
        rows = run_llama(gguf)
        (OUT / f"{name}.json").write_text(json.dumps(rows, indent=None) + "\n")
        gguf.with_suffix(".log").unlink(missing_ok=True)
        print(f"{name}: {gguf.stat().st_size} bytes, greedy {[r['generated_ids'][:6] for r in rows]}")


if __name__ == "__main__":
    main()
