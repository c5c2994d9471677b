"""gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE) beyond its llama-server fixture (test_arch_fixtures.py):
attention sinks on every CPU attention path against ggml's softmax with sinks, `swiglu_oai` against
ggml's formula, the spec's reading of the file, the exact dequantized experts against the blocks,
batch invariance, and a file missing a gpt-oss tensor."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from slotserver.errors import GGUFError
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat
from slotserver.runtime.batch import Batch, SeqChunk, softmax_sinks
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import KVSpec, PagedKV, StridedKV
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.loader import default_dir, load_by_path
from gguf_rewrite import rewrite

FIXTURE = Path(__file__).parent / "fixtures" / "archs" / "gpt-oss.gguf"
MARK = "GPT-OSS-TRITON "
PROMPT = [40, 41, 97, 98, 120, 7, 8, 250, 3, 14, 15, 92, 65, 35]


def _kernel(op: str, form: str):
    mod = load_by_path(default_dir("kernels") / f"{op}.py", KERNEL_CONTRACT).module
    if form == "native" and mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    if form == "torch":
        mod._LIB = None   # this module object only: the SDPA / written-out formulation
    return mod


def _ggml_softmax(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """ggml-cpu's soft_max_f32 with sinks, per row: the max taken with the sink, the sink's exp added
    to the sum, no value for it. scores [H, L], sinks [H]."""
    mx = np.maximum(scores.max(-1), sinks)
    p = np.exp(scores - mx[:, None])
    return p / (p.sum(-1) + np.exp(sinks - mx))[:, None]


def test_the_reference_softmax_is_ggmls_with_sinks():
    gen = torch.Generator().manual_seed(3)
    scores, sinks = torch.randn(4, 9, generator=gen) * 3, torch.randn(4, generator=gen) * 3
    got = softmax_sinks(scores, sinks)
    np.testing.assert_allclose(got.numpy(), _ggml_softmax(scores.double().numpy(), sinks.double().numpy()), rtol=1e-5)
    assert float(got.sum(-1).max()) < 1.0                                      # the sink took some mass
    batched = softmax_sinks(scores.view(1, 4, 1, 9).expand(2, 4, 3, 9), sinks)  # [B, heads, M, L] form
    assert torch.equal(batched[1, :, 2], got)
    assert torch.equal(softmax_sinks(scores, None), scores.softmax(-1))


def _prompt_case(op: str, cache: torch.dtype) -> tuple:
    """A decode row and a 20-token prompt chunk (AMX prompt rows where the CPU has them: head_dim 64,
    an f16 cache), group 2, over 40 cells; flat, or shuffled 8-cell pages."""
    gen = torch.Generator().manual_seed(11)
    kv_heads, group, dim, cells = 2, 2, 64, 40
    chunks = [SeqChunk(stream=1, start=30, tokens=[0]), SeqChunk(stream=0, start=4, tokens=[0] * 20, prompt=True)]
    meta = Batch.build(chunks).attn.with_layer(0, 0.0, 2 * torch.randn(kv_heads * group, generator=gen))
    q = torch.randn(21, kv_heads * group, dim, generator=gen)
    k, v = (torch.randn(2, cells, kv_heads, dim, generator=gen).to(cache) for _ in range(2))
    if op == "attention":
        return q, StridedKV(k, v), meta, 1 / math.sqrt(dim)
    order = torch.randperm(10, generator=gen)
    pages = [torch.empty(10, 8, kv_heads, dim, dtype=cache) for _ in range(2)]
    for p, t in zip(pages, (k, v)):
        p[order] = t.reshape(10, 8, kv_heads, dim)
    return q, PagedKV(pages[0], pages[1], order.view(2, 5).int(), 8), meta, 1 / math.sqrt(dim)


@pytest.mark.parametrize("form", ["native", "torch"])
@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_sinks_on_every_cpu_attention_path(op, form):
    """Random batches of every cache form (decode, prefill and prompt rows, windows, soft-caps, q8,
    f16) with sinks put on: the C row kernel (and AMX prompt tiles), or torch's written-out form,
    against the reference; and a prompt chunk on an f16 cache against ggml's softmax loop."""
    mod = _kernel(op, form)
    gen = torch.Generator().manual_seed(5)
    for i in range(12):
        dtype = (torch.float32, torch.bfloat16)[i % 2]
        q, kv, meta, scale = mod.example_inputs(gen, dtype)
        meta = meta.with_layer(meta.window, meta.softcap, 2 * torch.randn(q.shape[1], generator=gen))
        torch.testing.assert_close(mod.cpu(q, kv, meta, scale).float(), mod.reference(q, kv, meta, scale).float(),
                                   atol=mod.TOL[dtype], rtol=mod.TOL[dtype])
    q, kv, meta, scale = _prompt_case(op, torch.float16)
    got = mod.cpu(q, kv, meta, scale)
    k, v = (_cells(kv, t) for t in ("k", "v"))                               # [streams, cells, kv_heads, dim]
    for row, (stream, n) in enumerate(zip(meta.row_streams.tolist(), meta.row_kv_lens.tolist())):
        keys, vals = (t[stream, :n].double().repeat_interleave(2, dim=1).numpy() for t in (k, v))
        scores = np.einsum("hd,khd->hk", q[row].double().numpy(), keys) * scale
        want = np.einsum("hk,khd->hd", _ggml_softmax(scores, meta.sinks.double().numpy()), vals)
        np.testing.assert_allclose(got[row].numpy(), want, atol=1e-4)
    plain = mod.cpu(q, kv, meta.with_layer(0, 0.0), scale)
    assert float((plain - got).abs().max()) > 1e-2                            # the sinks matter here


def _cells(kv, which: str) -> torch.Tensor:
    if isinstance(kv, StridedKV):
        return getattr(kv, which)
    pages = getattr(kv, f"{which}_pages")
    return pages[kv.block_table.long()].reshape(kv.block_table.shape[0], -1, *pages.shape[2:])


def test_swiglu_oai_is_ggmls():
    """ggml-cpu's swiglu_oai (alpha 1.702, limit 7): gate clamped above, up both ways, in its order."""
    gate = torch.linspace(-12, 12, 97)
    up = torch.linspace(9, -9, 97)
    swiglu_oai = load_by_path(default_dir("kernels") / "moe_matmul.py", KERNEL_CONTRACT).module.swiglu_oai
    got = swiglu_oai(torch.cat([gate, up]).view(1, 194))[0]
    g, u = gate.numpy(), up.numpy()
    x, y = np.minimum(g, np.float32(7)), np.clip(u, np.float32(-7), np.float32(7))
    want = x / (np.float32(1) + np.exp(np.float32(1.702) * -x)) * (y + np.float32(1))
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-7, atol=1e-7)
    assert float(got[-1]) == pytest.approx(7 / (1 + math.exp(-1.702 * 7)) * -6, rel=1e-6)   # both clamps


def _model(kind: str) -> LlamaModel:
    return LlamaModel.load(FIXTURE, torch.float32, max_pos=64, fmt=WeightFormat(kind))


def _cache(model: LlamaModel, n: int):
    s = model.spec
    return create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, n, 64, s.n_kv_heads, s.head_dim, model.dtype))


def test_the_spec_reads_gpt_oss_as_llama_cpp():
    """load_swa_pattern(2): even layers windowed (the file's 6 cells), the global rope for both; yarn
    (factor 32 over 4096); top-k then softmax with the clamped SwiGLU; biases and sinks loaded."""
    model = _model("q")
    s, lw = model.spec, model.weights.layers[0]
    assert s.windows == (6, 0, 6, 0) and s.rope_params(0) == s.rope_params(1)
    assert s.rope.kind == "yarn" and s.rope_scale == 1 / 32 and s.rope.orig_ctx == 4096
    assert (s.moe.gating, s.moe.act, s.moe.n_expert, s.moe.n_used, s.moe.norm_weights) == \
        ("softmax_weight", "swiglu_oai", 4, 2, False)
    assert lw.sinks.shape == (4,) and lw.wo.bias.shape == (32,) and lw.qkv.bias.shape == (128,)
    assert lw.moe.router_bias.shape == (4,) and lw.moe.gate_up_bias.shape == (4, 64)
    assert lw.moe.down_bias.shape == (4, 32) and lw.moe.down.qtype == gguf.GGMLQuantizationType.MXFP4


def test_the_exact_dequantized_experts_stay_close_to_the_blocks():
    """`--weights dense` (MXFP4 experts dequantized, torch's grouping, float32 activations) against
    the blocks (moe_matmul's C, 8-bit activations as llama.cpp): the biased, clamped path lines up
    in both; the gap is the activations' 8-bit rounding (llama-server's top-8 differ from the dense
    path by up to 7e-3, from the blocks by 7e-4: test_arch_fixtures.py)."""
    dense, blocks = _model("dense"), _model("q")
    a, b = (m.forward(Batch.build([SeqChunk(0, 0, PROMPT, all_logits=True)]), _cache(m, 1)) for m in (dense, blocks))
    assert float((a.softmax(-1) - b.softmax(-1)).abs().max()) < 0.02
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.85


def test_a_sequence_gives_the_same_floats_alone_or_in_a_batch(tmp_path):
    """Batch invariance with sinks, windows and the biased experts: a sequence's decode logits do not
    depend on the rows beside it; and a decode step (sinks, biases, swiglu_oai all in C calls)
    replays from a step graph with the floats of running it as usual. The fixture's F32 matrices in
    Q8_0 (qmatmul's repacked dots are invariant; an F32 matrix goes through torch's GEMM)."""
    model = LlamaModel.load(_rewrite(FIXTURE, tmp_path / "q8.gguf", q8=True), torch.float32, max_pos=64,
                            fmt=WeightFormat("q"))
    if model.kernels.modules["attention"].module._LIB is None or model.graphs is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0): torch's forms are not batch-invariant")
    prompts = [PROMPT, [5, 6, 7, 260, 261], [300, 2, 77]]

    def run(indices: list[int]) -> list[torch.Tensor]:
        cache = _cache(model, 3)
        model.forward(Batch.build([SeqChunk(i, 0, prompts[i]) for i in indices]), cache)
        out = []
        for step in range(9):   # past the 6-cell window of the shortest prompt
            out.append(model.forward(Batch.build([SeqChunk(i, len(prompts[i]) + step, [50 + step + i])
                                                  for i in indices]), cache))
        return out

    together = run([0, 1, 2])
    assert [key[0] for key in model.graphs.graphs] == [3]        # captured, then replayed: C calls only
    alone = run([1])
    assert all(torch.equal(t[1], a[0]) for t, a in zip(together, alone))
    model.set_step_graphs(False)
    assert all(torch.equal(a, b) for a, b in zip(together, run([0, 1, 2])))


def _rewrite(src: Path, dst: Path, skip: str = "", q8: bool = False) -> Path:
    """src without the tensor `skip`; q8: its F32 matrices (the router's aside) in Q8_0."""
    Q8 = gguf.GGMLQuantizationType.Q8_0

    def tensor(name: str, data: np.ndarray, qtype):
        if name == skip:
            return None
        if q8 and qtype == gguf.GGMLQuantizationType.F32 and data.ndim == 2 and "gate_inp" not in name:
            return gguf.quants.quantize(data, Q8), Q8
        return data, qtype   # quantized: the blocks' bytes, from which the writer derives the shape
    return rewrite(src, dst, tensors=tensor)


@pytest.mark.parametrize("missing", ["blk.1.attn_sinks.weight", "blk.2.attn_output.bias", "blk.0.ffn_up_exps.bias"])
def test_a_file_missing_a_gpt_oss_tensor_is_refused_in_one_line(tmp_path, missing):
    path = _rewrite(FIXTURE, tmp_path / "m.gguf", missing)
    with pytest.raises(GGUFError, match=missing.replace(".", r"\.")) as e:
        LlamaModel.load(path, torch.float32, max_pos=64, fmt=WeightFormat("q"))
    assert "\n" not in str(e.value)


def test_the_experts_kernel_clamps_and_biases_in_c():
    """moe_matmul's C with act "oai" and expert biases on MXFP4 experts, gates and ups well past the
    clamps (|x| up to ~15): the reference's floats within the 8-bit activations' noise (2% of each
    row's largest output), where plain SwiGLU or dropping the bias would be far off."""
    mod = _kernel("moe_matmul", "native")
    from slotserver.runtime.experts import Experts
    from slotserver.runtime.qblocks import T, random_qweight
    gen = torch.Generator().manual_seed(4)
    e, n, k, t, used = 4, 48, 64, 5, 2
    w = Experts((random_qweight(gen, T.MXFP4, e * n, k),), e)
    ids = torch.stack([torch.randperm(e, generator=gen)[:used] for _ in range(t)])
    x, bias = torch.randn(t, used, 2 * k, generator=gen) * 5, torch.randn(e, n, generator=gen)
    weights = torch.rand(t, used, generator=gen)
    got = mod.cpu(x, w, ids, True, weights, None, bias, "oai")
    want = mod.reference(x, w, ids, True, weights, None, bias, "oai")
    row = want.abs().amax(-1, keepdim=True)
    assert bool(((got - want).abs() <= 0.02 * row).all())
    for other in (mod.reference(x, w, ids, True, weights, None, bias, "silu"),
                  mod.reference(x, w, ids, True, weights, None, None, "oai")):
        assert float(((other - want).abs() / row).max()) > 0.1


@pytest.mark.parametrize("op", ["attention", "moe_matmul"])
def test_a_kernels_folder_from_before_sinks_is_refused_at_load(tmp_path, op):
    """A lab copy of attention.py from before sinks would ignore them silently (moe_matmul's would
    fail mid-step): refused at load in one line naming the file; the other architectures still load."""
    import shutil
    from slotserver.errors import ModuleLoadError
    from slotserver.runtime.kernel_set import KernelSet
    folder = tmp_path / "kernels"
    shutil.copytree(default_dir("kernels"), folder)
    src = (folder / f"{op}.py").read_text()
    (folder / f"{op}.py").write_text(src.replace("\nFUSES = (", "\n_FUSES = (", 1))
    with pytest.raises(ModuleLoadError, match=f"gpt-oss.gguf: a gpt-oss model needs kernels/{op}.py with"):
        LlamaModel.load(FIXTURE, kernels=KernelSet.load(folder))
    assert LlamaModel.load(FIXTURE.with_name("qwen3moe.gguf"), kernels=KernelSet.load(folder)).spec.arch == "qwen3moe"


def _triton_vs_cpu() -> dict:
    """Runs under TRITON_INTERPRET=1: the fixture's three prompts prefilled and decoded 3 steps on a
    paged layout with the Triton kernels (sinks in the paged prefill and decode kernels; router
    bias, expert biases and swiglu_oai around the Triton expert matmul) and with the CPU kernels."""
    from slotserver.runtime.kernel_set import KernelSet
    sys.path.insert(0, str(Path(__file__).parent))
    import test_arch_fixtures as arch
    rows = json.loads(FIXTURE.with_suffix(".json").read_text())
    for r in rows:
        r["generated_ids"] = r["generated_ids"][:4]
    out = {}
    for impl in ("triton", "cpu"):
        model = LlamaModel.load(FIXTURE, torch.float32, max_pos=64, kernels=KernelSet.load(impl=impl))
        out[impl] = [lg.softmax(-1).tolist() for lg in arch._decoded(model, rows, "paged")]
    return out


def test_the_triton_kernels_give_the_cpu_kernels_probabilities():
    """The whole model on the Triton kernels (triton's interpreter, in a subprocess: see
    test_triton_kernels.py) against the CPU kernels, both on the dequantized float32 weights."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len(MARK):])
    tri, cpu = (torch.tensor(got[k]) for k in ("triton", "cpu"))
    assert tri.shape == cpu.shape == (3, 4, 310)
    assert float((tri - cpu).abs().max()) < 1e-5


if __name__ == "__main__":   # the interpreted half, run by the test above
    print(MARK + json.dumps(_triton_vs_cpu()))
