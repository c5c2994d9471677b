"""Mixture-of-experts models beyond the llama.cpp fixtures (tests/test_arch_fixtures.py checks the
F32 ones against llama-server): quantized experts on the C path, batch invariance, the routing
switches no fixture has, the expert kernel against qmatmul, and what a MoE file refuses."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from slotserver.errors import GGUFError, ModuleLoadError
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.experts import Experts
from slotserver.runtime.kernel_set import KERNEL_CONTRACT, KernelSet
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import T, random_qweight
from gguf_rewrite import rewrite

ARCHS = Path(__file__).parent / "fixtures" / "archs"
MOE = ["qwen3moe", "olmoe", "granitemoe", "qwen2moe", "nemotron_h_moe"]


def q8_copy(src: Path, dst: Path) -> Path:
    """`src` with every matrix (experts included, the router not: llama-quantize keeps it F32) in Q8_0."""
    def q8(name: str, data: np.ndarray, qtype):
        if data.ndim >= 2 and "gate_inp" not in name and data.shape[-1] % 32 == 0:
            return gguf.quants.quantize(data, T.Q8_0), T.Q8_0
        return data, qtype
    return rewrite(src, dst, tensors=q8)


def _cache(model: LlamaModel, n: int):
    s = model.spec
    return create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, n, 64, s.n_kv_heads, s.head_dim, model.dtype))


PROMPT = [40, 41, 97, 98, 120, 7, 8, 250, 3, 14, 15, 92, 65, 35]


@pytest.mark.parametrize("case", MOE)
def test_q8_0_experts_on_blocks_match_their_dequantized_weights(tmp_path, case):
    """The experts' GGUF blocks through moe_matmul's C (8-bit activations) stay close to the same
    file dequantized to float32 (exact torch grouping): grouping, offsets and parts line up. One
    position of the 14 may differ more: 8-bit noise can flip a near-tie of the router to another
    expert (granitemoe's position 5 does), as between llama.cpp's own quantized and F32 runs; a
    wrong expert offset or part would move every position."""
    path = q8_copy(ARCHS / f"{case}.gguf", tmp_path / "q8.gguf")
    dense, blocks = (LlamaModel.load(path, torch.float32, max_pos=64, fmt=WeightFormat(k)) for k in ("dense", "q"))
    moe = next(lw.moe for lw in blocks.weights.layers if lw.moe is not None)   # (nemotron_h_moe's layer 0 is Mamba-2)
    assert isinstance(moe.down, Experts) and moe.down.qtype == T.Q8_0
    a, b = (m.forward(Batch.build([SeqChunk(0, 0, PROMPT, all_logits=True)]), _cache(m, 1)) for m in (dense, blocks))
    far = ((a - b).abs().amax(-1) > 0.04 * a.abs().max()) | ((a.softmax(-1) - b.softmax(-1)).abs().amax(-1) > 0.02)
    assert int(far.sum()) <= 1, far.tolist()


def test_a_sequence_decodes_the_same_floats_alone_or_in_a_batch(tmp_path):
    """Batch invariance through the experts: a sequence's logits do not depend on which other rows
    (routed to other experts) share its step; and a qwen3moe decode step (route, experts, their sum
    and the residual add all in C) replays from a step graph with the floats of running it as usual."""
    model = LlamaModel.load(q8_copy(ARCHS / "qwen3moe.gguf", tmp_path / "q8.gguf"), torch.float32, max_pos=64,
                            fmt=WeightFormat("q"))
    if model.kernels.modules["moe_matmul"].module._LIB is None or model.graphs is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0): torch's forms are not batch-invariant")
    prompts = [PROMPT, [5, 6, 7, 260, 261], [300, 2, 77]]

    def run(indices: list[int]) -> list[torch.Tensor]:
        cache = _cache(model, 3)
        model.forward(Batch.build([SeqChunk(i, 0, prompts[i]) for i in indices]), cache)
        out = []
        for step in range(4):
            chunks = [SeqChunk(i, len(prompts[i]) + step, [50 + step + i]) for i in indices]
            out.append(model.forward(Batch.build(chunks), cache))
        return out

    together = run([0, 1, 2])
    assert [key[0] for key in model.graphs.graphs] == [3]        # captured, then replayed
    alone = run([1])                                             # (a new cache: the graphs are recaptured)
    assert [key[0] for key in model.graphs.graphs] == [1]
    assert all(torch.equal(t[1], a[0]) for t, a in zip(together, alone))
    model.set_step_graphs(False)
    assert all(torch.equal(a, b) for a, b in zip(together, run([0, 1, 2])))


@pytest.mark.parametrize("form", ["native", "torch"])
def test_route_follows_llama_cpp_order(form):
    """softmax then top-k (weights: the selected probabilities, renormalized or not); gpt-oss's
    softmax_weight: top-k of the raw logits, softmax over the k; renormalization's floor."""
    mod = load_by_path(default_dir("kernels") / "moe_route.py", KERNEL_CONTRACT).module
    if form == "native" and mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    if form == "torch":
        mod._LIB = None
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 8, generator=gen) * 3
    eye = torch.eye(8, dtype=torch.float64)                         # router = identity: logits = h
    top = logits.softmax(-1).topk(3, dim=-1)
    ids, w = mod.cpu(logits, eye, 3, 0, False)
    assert torch.equal(ids, top.indices) and torch.allclose(w, top.values)
    ids, w = mod.cpu(logits, eye, 3, 0, True)
    assert torch.allclose(w, top.values / top.values.sum(-1, keepdim=True))
    ids, w = mod.cpu(logits, eye, 2, 1, False)
    raw = logits.topk(2, dim=-1)
    assert torch.equal(ids, raw.indices) and torch.allclose(w, raw.values.softmax(-1))
    ids, w = mod.cpu(logits, eye, 2, 0, False, 2.5)
    assert torch.allclose(w, 2.5 * logits.softmax(-1).topk(2, dim=-1).values)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.Q4_1, T.MXFP4])
def test_experts_kernel_gives_qmatmul_floats_per_expert(qtype):
    """moe_matmul's C (grouping, per-expert offsets, two parts ending mid-group) gives for every
    (token, slot) exactly qmatmul's row of that expert's matrix, on the same repacked dots."""
    mm = load_by_path(default_dir("kernels") / "moe_matmul.py", KERNEL_CONTRACT).module
    qm = load_by_path(default_dir("kernels") / "qmatmul.py", KERNEL_CONTRACT).module
    if mm._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    gen = torch.Generator().manual_seed(int(qtype))
    k = 256 if qtype in (T.Q4_K, T.Q6_K) else 96
    experts = Experts(tuple(random_qweight(gen, qtype, 6 * n, k) for n in (24, 40)), 6)
    ids = torch.stack([torch.randperm(6, generator=gen)[:3] for _ in range(7)])      # [7, 3]
    x = torch.randn(7, k, generator=gen)
    y = mm.cpu(x, experts, ids)                                                       # [7, 3, 64]
    for e in range(6):
        want = torch.cat([qm.cpu(x, p) for p in experts.expert_parts(e)], dim=1)     # [7, 64]
        t, j = (ids == e).nonzero(as_tuple=True)
        assert torch.equal(y[t, j], want[t])


def test_int8_weights_are_refused_for_experts_in_one_line():
    with pytest.raises(GGUFError, match=r"qwen3moe.gguf: a qwen3moe mixture-of-experts model .* not --weights int8"):
        LlamaModel.load(ARCHS / "qwen3moe.gguf", torch.bfloat16, fmt=WeightFormat("int8"))


def test_a_kernel_set_without_the_expert_kernels_is_refused_at_load():
    """A lab folder copied before kernels/moe_route.py existed: one line at load naming it (the
    set built without it here: a copied folder would compile every kernel again for its paths)."""
    full = KernelSet.load()
    partial = KernelSet({op: m for op, m in full.modules.items() if op != "moe_route"})
    with pytest.raises(ModuleLoadError, match="olmoe.gguf: a olmoe model needs the kernel moe_route"):
        LlamaModel.load(ARCHS / "olmoe.gguf", kernels=partial)


def test_what_nemotron_h_moe_files_need_that_is_not_here_is_refused_in_one_line(tmp_path):
    """Grouped expert selection (expert_group_count > 1, which llama.cpp applies for any file) is not
    computed, and Nemotron 3 Super's latent experts need both projections and their size: the load
    says so rather than route or multiply otherwise."""
    src = ARCHS / "nemotron_h_moe.gguf"
    grouped = rewrite(src, tmp_path / "grouped.gguf",
                      keys={"nemotron_h_moe.expert_group_count": (2, gguf.GGUFValueType.UINT32)})
    with pytest.raises(GGUFError, match="expert_group_count 2: grouped expert selection is not supported"):
        LlamaModel.load(grouped)
    half = rewrite(ARCHS / "nemotron_h_latent.gguf", tmp_path / "half.gguf",
                   tensors=lambda name, data, qtype: None if "ffn_latent_up" in name else (data, qtype))
    with pytest.raises(GGUFError, match="layer 1: ffn_latent_down, ffn_latent_up and moe_latent_size come together"):
        LlamaModel.load(half)


def test_a_nemotron_h_moe_file_with_its_mtp_head_runs_without_it(tmp_path):
    """The converter writes Nemotron 3's MTP head as one more block (block_count + 1, and one more
    entry in the per-layer arrays); llama.cpp skips it unless asked to draft with it, and so does
    the load here: the same logits as the file without it."""
    src = ARCHS / "nemotron_h_moe.gguf"
    arch, array, u32 = "nemotron_h_moe.", gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
    fields = gguf.GGUFReader(src).fields
    keys = {arch + "block_count": (7, u32), arch + "nextn_predict_layers": (1, u32)}
    for name in ("feed_forward_length", "attention.head_count_kv"):
        keys[arch + name] = (fields[arch + name].contents() + [32 if name == "feed_forward_length" else 2], array, u32)
    mtp = rewrite(src, tmp_path / "mtp.gguf", keys=keys, extra={"blk.6.attn_norm.weight": np.ones(32)})
    a, b = (LlamaModel.load(p, torch.float32, max_pos=64) for p in (src, mtp))
    assert b.spec.n_layers == 6 and b.spec.ffn_only == a.spec.ffn_only
    logits = [m.forward(Batch.build([SeqChunk(0, 0, PROMPT, all_logits=True)]), _cache(m, 1)) for m in (a, b)]
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("change", ["no selection bias", "no weights scale"])
def test_the_nemotron_h_moe_fixture_tells_its_routing_switches_apart(tmp_path, change):
    """The fixture's comparison with llama-server can fail on what nemotron_h_moe adds to routing:
    the same file without its selection biases (exp_probs_b) or with expert_weights_scale 1 is far
    from llama-server's recorded outputs (README's 0.12 / 0.096), where the file itself is within
    2e-6 (tests/test_arch_fixtures.py)."""
    from test_arch_fixtures import N_CTX, _prefilled, top8_diff
    src = ARCHS / "nemotron_h_moe.gguf"
    if change == "no selection bias":
        path = rewrite(src, tmp_path / "m.gguf", tensors=lambda n, d, q: None if "exp_probs_b" in n else (d, q))
    else:
        scale = {"nemotron_h_moe.expert_weights_scale": (1.0, gguf.GGUFValueType.FLOAT32)}
        path = rewrite(src, tmp_path / "m.gguf", keys=scale)
    rows = json.loads((ARCHS / "nemotron_h_moe.json").read_text())
    model = LlamaModel.load(path, torch.float32, max_pos=N_CTX)
    worst = max(top8_diff(lp.log_softmax(-1)[i], step)
                for lp, r in zip(_prefilled(model, rows), rows) for i, step in enumerate(r["steps"]))
    assert worst > 0.05, worst


def test_relu2_experts_on_blocks_match_the_reference():
    """moe_matmul's relu2 (nemotron_h_moe's ungated experts: max(x, 0)^2 while grouping the rows) on
    Q8_0 blocks against the reference, every case at once: per-slot rows, weighted sum, residual."""
    gen = torch.Generator().manual_seed(3)
    mod = load_by_path(default_dir("kernels") / "moe_matmul.py", KERNEL_CONTRACT).module
    if mod._LIB is None:   # cpu would be the reference's torch form: nothing to compare
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    experts = Experts((random_qweight(gen, T.Q8_0, 6 * 40, 64),), 6)
    ids = torch.stack([torch.randperm(6, generator=gen)[:2] for _ in range(9)])
    x, w = 0.5 * torch.randn(9, 2, 64, generator=gen), torch.rand(9, 2, generator=gen)
    acc = torch.randn(9, 40, generator=gen)
    got = mod.cpu(x, experts, ids, False, w, acc.clone(), None, "relu2")
    want = mod.reference(x, experts, ids, False, w, acc.clone(), None, "relu2")
    assert (got - want).abs().max() <= 3e-2 * (1 + want.abs().max())
    silu = mod.reference(x, experts, ids, False, w, acc.clone(), None, "silu")   # relu2 is not ignored
    assert (got - silu).abs().max() > 0.1
