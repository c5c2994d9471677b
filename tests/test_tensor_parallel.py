"""`--tp 2` over gloo on this machine gives what one process gives (issue 39, part 2).

Two ranks (tests/tp_ranks.py, started with torchrun's environment) run `generate` on the default
model and on the tiny fixtures whose layers split differently across ranks (DENSE, MOE), then serve the default model through
HTTP; this process computes the same without TP and compares what a user sees: greedy tokens,
top-8 log-probabilities (float32, within 1e-4), n > 1 choices, grammar-constrained text, slot files
(one saved here restored there, one saved there restored here), and /props' per-rank memory.
The `slotserver generate --tp 2` command line (its own spawned rank) is checked on one fixture.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from starlette.testclient import TestClient

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.generate import GenRequest, generate
from slotserver.model.model import LlamaModel
from slotserver.model.sampling.params import SamplingParams
from slotserver.server import ServerConfig, ServerState, create_app

sys.path.insert(0, str(Path(__file__).parent))
from tp_ranks import N_PREDICT, PROMPT, SERVE_CASES, SLOT_PROMPT  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ROOT / "tests" / "fixtures" / "archs"
# what splits differently across ranks: q/k norms (qwen3; olmoe's over the whole projection), post-norms and
# soft-caps (gemma2/3), fused qkv and gate|up (phi3), biases (qwen2), experts (qwen3moe; qwen2moe: a shared
# expert; gpt-oss: biases, sinks). Left out, as no rank splits them differently: RoPE factors
# (llama3_freqs, llama_linear: per dimension, every head alike) and granite's scalar multipliers
DENSE = ["qwen3", "gemma2", "gemma3", "phi3", "qwen2_yarn"]   # qwen3: served too
MOE = ["qwen3moe", "qwen2moe", "olmoe", "gpt-oss"]
TOL = 1e-4


def _fixtures() -> list[str]:
    return [str(ARCHS / f"{a}.gguf") for a in DENSE + MOE]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(what the two ranks saw, this process's server and its answers), the ranks run once."""
    slots = tmp_path_factory.mktemp("slots")
    procs = _start_ranks(slots)   # they run while this process computes its side
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(ARCHS / f"{DENSE[0]}.gguf", dtype="float32", threads=min(threads, 2)))
    engine = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=3 * 256, slot_save_path=slots)).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), slot_save_path=slots))
    state.set_loaded(bundle, engine)
    try:
        with TestClient(create_app(state)) as client:
            base = _baseline(client)
            refs = _references(bundle.model.kernels)
            tp = _finish_ranks(procs, slots)
            base["tp_file"] = _restore(client, "tp.bin")
            yield tp, base, refs
    finally:
        engine.stop()
        torch.set_num_threads(threads)


def _references(kernels) -> dict:
    """name -> GenResult of the greedy run without TP."""
    req = GenRequest(PROMPT, N_PREDICT, SamplingParams(temperature=0.0, n_probs=8), ignore_eos=True)
    paths = {"default": default_model_path()} | {p: p for p in _fixtures()}
    models = {name: LlamaModel.load(p, torch.float32, kernels=kernels) for name, p in paths.items()}
    return {name: generate(m, [req], frozenset())[0] for name, m in models.items()}


def _baseline(client) -> dict:
    body = {"prompt": SLOT_PROMPT, "n_predict": 6, "temperature": 0, "id_slot": 0, "cache_prompt": True}
    client.post("/completion", json=body)
    assert client.post("/slots/0?action=save", json={"filename": "base.bin"}).status_code == 200
    return {"cases": [client.post(path, json=b).json() for path, b in SERVE_CASES],
            "restored": _restore(client, "base.bin")}


def _restore(client, name: str) -> dict:
    assert client.post("/slots/1?action=restore", json={"filename": name}).status_code == 200
    body = {"prompt": SLOT_PROMPT, "n_predict": 6, "temperature": 0, "id_slot": 1, "cache_prompt": True}
    return client.post("/completion", json=body).json()


def _start_ranks(slots: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "tests" / "tp_ranks.py"), str(slots / "tp.json"), str(slots), *_fixtures()]
    return [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stderr=subprocess.PIPE, text=True)
            for r in range(2)]


def _finish_ranks(procs: list[subprocess.Popen], slots: Path) -> dict:
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    return json.loads((slots / "tp.json").read_text())


def _close(tp_top: list, base_top: list) -> None:
    """Top-8 (id, logprob) lists: every id clear of the 8th by TOL is in both, within TOL."""
    got = dict((int(i), lp) for i, lp in tp_top)
    cut = base_top[-1][1] + TOL
    for i, lp in base_top:
        if lp > cut:
            assert int(i) in got and abs(got[int(i)] - lp) < TOL, (i, lp, got)


@pytest.mark.parametrize("name", ["default"] + DENSE + MOE)
def test_generate_tp2_equals_tp1(runs, name):
    tp, _, refs = runs
    key = "default" if name == "default" else str(ARCHS / f"{name}.gguf")
    base, got = refs[key], tp["generate"][key]
    assert [t for t, _ in got] == base.tokens
    for (_, top), base_top in zip(got, base.top):
        _close(top, base_top)


def test_served_answers_under_tp_equal_one_process(runs):
    """Greedy text with top-8 probabilities, n = 2 choices, a GBNF grammar: the same answers."""
    tp, base, _ = runs
    (comp, chat, gram), (b_comp, b_chat, b_gram) = tp["serve"]["cases"], base["cases"]
    assert comp["content"] == b_comp["content"]
    for p, q in zip(comp["completion_probabilities"], b_comp["completion_probabilities"]):
        assert p["id"] == q["id"]
        _close([(t["id"], t["logprob"]) for t in p["top_logprobs"]], [(t["id"], t["logprob"]) for t in q["top_logprobs"]])
    texts = [c["message"]["content"] for c in chat["choices"]]
    assert len(texts) == 2 and texts == [c["message"]["content"] for c in b_chat["choices"]]
    assert gram["content"] == b_gram["content"] and gram["content"] in (" yes.", " no.")


def test_slot_files_cross_between_tp_and_one_process(runs):
    """A slot saved without TP restores under TP and the other way round: the same cached cells
    serve the prompt (cache_n) and the same text follows."""
    tp, base, _ = runs
    for got in (tp["serve"]["restored"], base["tp_file"]):
        assert got["content"] == base["restored"]["content"]
        assert got["timings"]["cache_n"] == base["restored"]["timings"]["cache_n"] > 0
    assert tp["serve"]["saved"]["n_saved"] > 0


def test_a_lab_kernel_swap_reaches_every_rank(runs):
    """The lab's swap on rank 0 (between two steps) serves the new kernel on both ranks."""
    tp, _, _ = runs
    *ranks, new = tp["serve"]["kernels"]
    assert ranks == [new, new]


def test_a_lab_layout_swap_reaches_every_rank_and_keeps_the_conversation(runs):
    """/lab/layout under --tp: every rank serves the new layout (and, after a save seen by the
    watcher, its new version; after the swap back, the old one), and a slot's history migrated on
    each rank continues with the text and top-8 log-probabilities it had before any swap."""
    tp, _, _ = runs
    got = tp["serve"]["layouts"]
    start, paged, saved, back = got["start"], got["paged"], got["saved"], got["back"]
    assert start[0]["name"] == "head_seq_dim" and start == [start[0]] * 2
    assert paged["result"] == "swapped" and paged["migrated_cells"] > 0
    assert got["paged_ranks"] == [{"name": "paged", "version": paged["version"]}] * 2
    assert saved["result"] == "swapped" and saved["version"] != paged["version"]
    assert got["saved_ranks"] == [{"name": "paged", "version": saved["version"]}] * 2
    assert back["result"] == "swapped" and got["back_ranks"] == start
    before = got["before"]
    assert before["timings"]["cache_n"] > 0 and before["content"]
    for answer in (got["after"], got["again"]):
        assert answer["content"] == before["content"] and answer["timings"]["cache_n"] >= before["timings"]["cache_n"]
        for p, q in zip(answer["completion_probabilities"], before["completion_probabilities"]):
            assert p["id"] == q["id"]
            _close([(t["id"], t["logprob"]) for t in p["top_logprobs"]], [(t["id"], t["logprob"]) for t in q["top_logprobs"]])


def test_a_refused_layout_leaves_every_rank_on_the_old_one(runs):
    """A layout failing validation is a 400 naming what failed; one that rank 1 cannot make is refused
    on every rank, naming rank 1's reason; one saved again after its validation is refused before
    any rank sees it. Both ranks keep the layout they had (the other test's last answer ran on it)."""
    tp, _, _ = runs
    got = tp["serve"]["layouts"]
    serving, refused = got["back_ranks"], got["refused"]
    (status, body), (status1, body1) = refused["invalid"], refused["rank1_fails"]
    assert status == 400 and "layout 'broken' refused: wrong numerics" in body["error"]["message"]
    says = "layout 'rank0_only' refused: rank 1: MemoryError('not on this rank')"
    assert status1 == 400 and says in body1["error"]["message"]
    assert refused["changed"].startswith("ModuleLoadError") and "saved again since version" in refused["changed"]
    assert refused["invalid_ranks"] == refused["rank1_fails_ranks"] == refused["changed_ranks"] == serving


def test_a_kernel_one_rank_cannot_load_is_refused_on_every_rank(runs):
    """A kernel swap is all or nothing too: rank 1 failing to import it leaves both ranks (rank 0
    included) on the kernel they served, and says why."""
    tp, _, _ = runs
    got = tp["serve"]["layouts"]["refused"]["kernel"]
    assert got["error"].startswith("ModuleLoadError: rank 1:") and "not on this rank" in got["error"]
    assert got["after"] == got["before"] == [got["before"][0]] * 2


def test_props_reports_each_ranks_heads_and_memory(runs):
    tp, _, _ = runs
    props = tp["serve"]["props"]
    ranks = props["ranks"]
    assert props["world"] == 2 and [r["kv_heads"] for r in ranks] == [1, 1]   # the fixture's 2 KV heads
    assert ranks[0]["kv_bytes"] == ranks[1]["kv_bytes"] > 0 and all(r["weights_bytes"] > 0 for r in ranks)


def test_generate_command_line_tp2_prints_the_tp1_text():
    """`slotserver generate --tp 2` (rank 1 spawned by the command itself) prints what one process does."""
    path = ARCHS / "qwen3.gguf"
    cmd = [sys.executable, "-m", "slotserver.cli.main", "generate", "-m", str(path), "--dtype", "float32",
           "--temp", "0", "-n", "8", "--tp", "2", "hello world"]
    two = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert two.returncode == 0, two.stderr
    bundle = ModelBundle.load(ModelConfig(path, dtype="float32", threads=1))
    ids = bundle.tokenizer.encode("hello world", add_special=True, parse_special=True)
    tokens = generate(bundle.model, [GenRequest(ids, 8)], bundle.tokenizer.eog_ids)[0].tokens
    text = bundle.tokenizer.decode([t for t in tokens if t not in bundle.tokenizer.eog_ids])
    assert text.strip() and two.stdout == text + "\n"


def test_uneven_splits_cover_every_item_once():
    from slotserver.parallel.shard import split

    assert split(3, 2) == [(0, 2), (2, 3)]                      # SmolLM2's 3 KV heads over 2 ranks
    assert split(1536, 2, 32) == [(0, 768), (768, 1536)]
    assert split(160, 3, 32) == [(0, 64), (64, 128), (128, 160)]


@pytest.mark.parametrize("name, world, weights, says", [
    # gpt-oss's experts in their MXFP4 blocks: d_ff 32 is one 32-wide block
    ("gpt-oss", 2, "q", "the experts' d_ff 32 does not split in 2 parts of whole 32-column blocks; "
                        "use --weights dense"),
    ("qwen3", 3, "auto", "the model has 2 KV heads, fewer than the ranks"),
    ("deepseek2", 2, "auto", "deepseek2's latent attention .* is not split across ranks"),
])
def test_what_does_not_split_is_refused_in_one_line(name, world, weights, says):
    from slotserver.model.weights import WeightFormat
    from slotserver.parallel.shard import ShardError, ShardPlan

    model = LlamaModel.load(ARCHS / f"{name}.gguf", torch.float32, fmt=WeightFormat(weights))
    with pytest.raises(ShardError, match=says) as e:
        ShardPlan.make(model, world)
    assert f"--tp {world}" in str(e.value) and "\n" not in str(e.value)


def test_serve_command_line_tp2_answers_and_both_ranks_exit():
    """`slotserver serve --tp 2` spawns its rank 1, serves what one process computes, reports two
    ranks in /props, and leaves no rank behind on SIGINT."""
    import re
    import signal
    import time

    import httpx

    path = ARCHS / "qwen3.gguf"
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(path), "--dtype", "float32", "--tp", "2",
           "--port", str(_free_port()), "-np", "2", "-c", "256", "--no-warmup"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            m = re.search(r"listening on (http://\S+)", proc.stderr.readline())
            url = m and m.group(1)
        body = {"prompt": [1, 17, 42, 99], "n_predict": 6, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        got = httpx.post(url + "/completion", json=body, timeout=60).json()
        props = httpx.get(url + "/props", timeout=10).json()["tensor_parallel"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    req = GenRequest([1, 17, 42, 99], 6, ignore_eos=True)
    model = LlamaModel.load(path, torch.float32)
    assert got["tokens"] == generate(model, [req], frozenset())[0].tokens
    assert props["world"] == 2 and len(props["ranks"]) == 2
    rank1 = subprocess.run(["pgrep", "-f", "--", " ".join(cmd[1:])], capture_output=True, text=True).stdout.split()
    assert rank1 == []


@pytest.mark.parametrize("c0, c1", [(0, 256), (256, 512), (192, 512)])   # the last cuts a 256-wide block
def test_a_column_slice_of_gguf_blocks_multiplies_like_those_columns(c0, c1):
    """Whole blocks stay blocks; a cut through a block dequantizes that slice. Either way the slice
    times its columns of x is the dequantized weight's product on them."""
    import gguf

    from slotserver.model.linear import Linear, QLinear
    from slotserver.parallel.shard import _cols
    from slotserver.runtime.kernel_set import KernelSet
    from slotserver.runtime.qblocks import dequantize, random_qweight

    gen = torch.Generator().manual_seed(3)
    w = random_qweight(gen, int(gguf.GGMLQuantizationType.Q4_K), 16, 512)
    x = torch.randn(3, 512, generator=gen)
    part = _cols(QLinear([w]), c0, c1)
    assert isinstance(part, QLinear if c0 % 256 == 0 else Linear)
    want = x[:, c0:c1] @ dequantize(w)[:, c0:c1].T
    got = part(x[:, c0:c1].contiguous(), KernelSet.load())
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("qtype, act", [("Q8_0", "silu"), ("MXFP4", "swiglu_oai"), ("F32", "silu")])
def test_an_expert_slice_multiplies_like_those_rows_and_columns(qtype, act):
    """One rank's slice of every expert (shard_experts.py) is those gate|up rows and down columns
    of the full experts, and the two ranks' partial MoE outputs (rank 0 with gpt-oss's down bias,
    the router replicated) sum to what the whole layer computes."""
    from slotserver.model.moe import MoeWeights, moe_ffn
    from slotserver.model.moe_spec import MoeSpec
    from slotserver.parallel.shard import split
    from slotserver.parallel.shard_experts import slice_experts
    from slotserver.runtime.experts import Experts
    from slotserver.runtime.kernel_set import KernelSet
    from slotserver.runtime.qblocks import T, random_qweight

    gen = torch.Generator().manual_seed(5)
    n_exp, ff, d, q = 4, 64, 64, int(T[qtype])
    oai = act == "swiglu_oai"
    biases = [torch.randn(*shape, generator=gen) * 0.1 for shape in ((n_exp,), (n_exp, 2 * ff), (n_exp, d))]
    full = MoeWeights(torch.randn(n_exp, d, generator=gen).double(),
                      [Experts((random_qweight(gen, q, n_exp * ff, d), random_qweight(gen, q, n_exp * ff, d)), n_exp)],
                      Experts((random_qweight(gen, q, n_exp * d, ff),), n_exp), None, *(biases if oai else (None,) * 3))
    spec = MoeSpec(n_exp, 2, ff, gating="softmax_weight" if oai else "softmax", act=act)
    ranges = split(ff, 2, 32)                                                      # [(0, 32), (32, 64)]
    shards = [slice_experts(full, f0, f1, keeps_down_bias=r == 0) for r, (f0, f1) in enumerate(ranges)]
    for (f0, f1), mine in zip(ranges, shards):
        for e in range(n_exp):
            gate_up = full.gate_up[0].dense(e)                                     # [2F, d]: gate, then up
            assert torch.equal(mine.gate_up[0].dense(e), torch.cat([gate_up[f0:f1], gate_up[ff + f0: ff + f1]]))
            assert torch.equal(mine.down.dense(e), full.down.dense(e)[:, f0:f1])
    ops = KernelSet.load()
    h = torch.randn(5, d, generator=gen)
    want = moe_ffn(ops, spec, full, h)
    got = sum(moe_ffn(ops, replace(spec, d_ff=f1 - f0), mine, h) for (f0, f1), mine in zip(ranges, shards))
    tol = 1e-5 if qtype == "F32" else 3e-2   # blocks: kernels/moe_matmul.py's TOL (8-bit activations)
    assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_each_ranks_weights_count_its_slice_of_the_experts():
    """/props' and the start log's per-rank weights (session.py) under --tp 2 on qwen2moe: each rank
    holds half of every expert and of the shared expert, and counts that half; over the two ranks
    only the embedding and the routers are counted twice (replicated)."""
    from slotserver.parallel.comm import Comm
    from slotserver.parallel.session import _memory
    from slotserver.parallel.shard import ShardPlan, shard_model

    path = ARCHS / "qwen2moe.gguf"
    whole = LlamaModel.load(path, torch.float32)
    plan = ShardPlan.make(whole, 2)
    ranks = [LlamaModel.load(path, torch.float32) for _ in range(2)]
    for r, m in enumerate(ranks):
        shard_model(m, Comm(r, 2), plan)   # no collective runs while sharding

    def experts(m):
        return sum(e.nbytes() for e in m.weights.experts())

    def held(m):   # the matmuls, this rank's experts, the embedding
        return sum(x.nbytes() for x in m.weights.matmuls()) + experts(m) + m.weights.embed.dense.numel() * 4

    assert [experts(m) for m in ranks] == [experts(whole) // 2] * 2 and experts(whole) > 0
    got = [_memory(r, m, None)["weights_bytes"] for r, m in enumerate(ranks)]
    assert all(g >= held(m) for g, m in zip(got, ranks))
    routers = sum(lw.moe.router.numel() * 8 for lw in whole.weights.layers)
    assert sum(got) == _memory(0, whole, None)["weights_bytes"] + whole.weights.embed.dense.numel() * 4 + routers
