"""Replayed decode steps (slotserver/model/step_graph.py) give exactly the logits of the Python
forward, and a step that cannot be replayed safely is never captured."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.runtime.kernel_set import KernelSet
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.loader import ModuleLoadError, load_source, read_source
from slotserver.model import step_graph
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.model import LlamaModel

PROMPTS = [[1, 339, 2783, 260], [1, 57, 9001, 12], [1, 700, 800, 900], [1, 5, 6, 7]]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = ModelConfig(default_model_path(), dtype="auto", weights="auto")   # what `serve` runs
    m = LlamaModel.load(cfg.model_path, cfg.torch_dtype, max_pos=128, fmt=cfg.weight_format)
    if m.kernels.modules["qmatmul"].module._LIB is None:
        pytest.skip("no C compiler: the kernels run in torch, and a step graph records only C calls")
    return m


def _native_rms_norm():
    """The rms_norm kernel module, for the tests about its C function (skipped without one)."""
    norm = KernelSet.load().modules["rms_norm"].module
    if norm._LIB is None:
        pytest.skip("no C compiler (or SLOTSERVER_NATIVE=0): no C call to record")
    return norm


def _decode(model: LlamaModel, rows: int, steps: int = 6, prompts: list[list[int]] = PROMPTS) -> list[torch.Tensor]:
    """Greedy decode of `rows` prompts on streams 0..rows-1 -> each step's logits."""
    s = model.spec
    cache = KVCache.create("head_seq_dim", KVSpec(s.n_layers, 4, 32, s.n_kv_heads, s.head_dim, torch.float16))
    for b in range(rows):
        model.forward(Batch.build([SeqChunk(b, 0, prompts[b], logits=False)]), cache)
    out, toks = [], [prompts[b][-1] for b in range(rows)]
    for i in range(steps):
        logits = model.forward(Batch.build([SeqChunk(b, 4 + i, [toks[b]]) for b in range(rows)]), cache)
        out.append(logits)
        toks = logits.argmax(-1).tolist()
    return out


def _replays_the_same(model: LlamaModel, rows: int, prompts: list[list[int]]) -> None:
    """A tiny model's steps run as usual, then with step graphs: replayed (a graph of `rows` rows
    was captured), and the same logits bit for bit."""
    if model.kernels.modules["qmatmul"].module._LIB is None:
        pytest.skip("no C compiler: the kernels run in torch, and a step graph records only C calls")
    model.set_step_graphs(False)
    plain = _decode(model, rows, prompts=prompts)
    model.set_step_graphs(True)
    replayed = _decode(model, rows, prompts=prompts)
    assert (rows, True, torch.get_num_threads()) in model.graphs.graphs
    for a, b in zip(plain, replayed):
        assert torch.equal(a, b)


@pytest.mark.parametrize("rows", [1, 4])
def test_replayed_decode_steps_give_the_forwards_logits_bit_for_bit(model, rows):
    model.set_step_graphs(False)
    plain = _decode(model, rows)
    model.set_step_graphs(True)
    replayed = _decode(model, rows)
    assert (rows, True, torch.get_num_threads()) in model.graphs.graphs   # steps 2.. were replays
    for a, b in zip(plain, replayed):
        assert torch.equal(a, b)


@pytest.mark.parametrize("rows", [1, 4])
def test_a_gemma3_model_replays_its_steps_with_the_same_logits(tmp_path, rows):
    """gemma3's post-norms (the residual added inside rms_norm's C) and per-head q/k norms (strided
    rows of the q|k|v projection, no copy) keep a whole step in C calls: replayed, not run in
    Python, and the same logits bit for bit."""
    import gguf
    from tiny_gguf import write_tiny_gguf
    from slotserver.model.weights import WeightFormat

    path = write_tiny_gguf(tmp_path / "g.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0, d_model=64, n_heads=4,
                           n_kv_heads=2, d_ff=128, arch="gemma3", n_layers=4, head_dim=32,
                           features=("qk_norm", "post_norms"),
                           **{"gemma3.attention.sliding_window": (4, gguf.GGUFValueType.UINT32)})
    gemma = LlamaModel.load(path, torch.float32, max_pos=128, fmt=WeightFormat("q"))
    _replays_the_same(gemma, rows, [[t % 300 for t in p] for p in PROMPTS])   # the tiny vocabulary


def test_a_qwen2_model_with_qkv_biases_replays_its_steps_with_the_same_logits(tmp_path):
    """qwen2's q|k|v biases are added by a C call (slotserver/model/bias_add.py): its decode steps
    are replayed (a torch add kept every qwen2 step out of a graph), with the same logits bit for bit."""
    import gguf
    from tiny_gguf import write_tiny_gguf
    from slotserver.model.weights import WeightFormat

    path = write_tiny_gguf(tmp_path / "q.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0, arch="qwen2",
                           qkv_bias=True)
    qwen = LlamaModel.load(path, torch.float32, max_pos=128, fmt=WeightFormat("q"))
    _replays_the_same(qwen, 2, [[t % 300 for t in p] for p in PROMPTS])


def test_a_replay_writes_the_logits_into_the_callers_buffer(model):
    """The engine passes a reused logits buffer: a replayed step writes its rows there (no fresh
    [rows, vocab] tensor a step), the same floats as a step run as usual."""
    model.set_step_graphs(False)
    plain = _decode(model, 2, steps=3)
    model.set_step_graphs(True)
    s = model.spec
    cache = KVCache.create("head_seq_dim", KVSpec(s.n_layers, 4, 32, s.n_kv_heads, s.head_dim, torch.float16))
    for b in range(2):
        model.forward(Batch.build([SeqChunk(b, 0, PROMPTS[b], logits=False)]), cache)
    buf, toks = torch.full((4, model.weights.output.out_features), float("nan")), [PROMPTS[b][-1] for b in range(2)]
    for i in range(3):
        logits = model.forward(Batch.build([SeqChunk(b, 4 + i, [toks[b]]) for b in range(2)]), cache, buf)
        assert torch.equal(logits, plain[i])
        toks = logits.argmax(-1).tolist()
    assert logits.data_ptr() == buf.data_ptr()          # the last step was a replay, into the buffer


def _norm_body(norm, rows: int):
    """A one-call step on `rows` rows (rms_norm's C) and its inputs, for the StepGraphs policy tests."""
    x, weight = [torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))], torch.ones(64)
    return x, (lambda: norm.cpu(x[0], weight, 1e-5))


def test_a_large_batch_is_captured_only_once_it_recurs():
    """Up to EAGER_ROWS rows a batch size is captured at once; a larger one after HOT_STEPS steps of
    it (a size that passes by while requests come and go costs no capture); every step's output is right."""
    norm = _native_rms_norm()
    graphs, owner = step_graph.StepGraphs(), (object(),)
    for rows in (step_graph.EAGER_ROWS, step_graph.EAGER_ROWS + 1):
        x, body = _norm_body(norm, rows)
        key = (rows, True, 1)
        for step in range(1, step_graph.HOT_STEPS + 2):
            out = graphs.run(owner, key, x, body, {})
            assert torch.allclose(out, norm.reference(x[0], torch.ones(64), 1e-5), atol=1e-5)
            captured = rows <= step_graph.EAGER_ROWS or step >= step_graph.HOT_STEPS
            assert (key in graphs.graphs) == captured, (rows, step)


def test_graphs_past_their_byte_budget_drop_the_least_recently_replayed():
    norm = _native_rms_norm()
    owner = (object(),)
    sizes = {}
    for rows in (2, 3):
        probe = step_graph.StepGraphs()
        x, body = _norm_body(norm, rows)
        probe.run(owner, (rows, True, 1), x, body, {})
        sizes[rows] = probe.nbytes()
    assert sizes[2] > 0
    graphs = step_graph.StepGraphs(budget=sizes[2] + sizes[3] + sizes[3] // 2)   # room for two of three
    steps = {rows: _norm_body(norm, rows) for rows in (2, 3, 4)}
    for rows in (2, 3, 2, 4):                # 3 is then the least recently replayed
        graphs.run(owner, (rows, True, 1), *steps[rows], {})
    assert set(k[0] for k in graphs.graphs) == {2, 4} and graphs.nbytes() <= graphs.budget
    small = step_graph.StepGraphs(budget=sizes[2] - 1)   # one graph larger than the whole budget
    for _ in range(3):
        out = small.run(owner, (2, True, 1), *steps[2], {})
    assert not small.graphs and small.tries[(2, True, 1)] == step_graph.MAX_TRIES
    assert torch.allclose(out, norm.reference(steps[2][0][0], torch.ones(64), 1e-5), atol=1e-5)


def test_a_lab_reload_gets_new_graphs_with_the_same_logits(model):
    """A reload swaps the kernel set between two steps: graphs of the old set must not serve it."""
    model.set_step_graphs(True)
    first = _decode(model, 1, steps=3)
    key = (1, True, torch.get_num_threads())
    old = model.graphs.graphs[key]
    kernels = model.kernels
    try:
        model.kernels = kernels.with_module("rope", kernels.modules["rope"])   # what a lab reload does
        again = _decode(model, 1, steps=3)
        assert model.graphs.graphs[key] is not old
    finally:
        model.kernels = kernels
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def _inputs() -> list[torch.Tensor]:
    return [torch.arange(8, dtype=torch.float32)]


def test_a_body_that_computes_in_torch_is_not_captured():
    x = _inputs()
    graph, out = step_graph.capture(lambda: x[0] * 2, x, {})
    assert graph is None and torch.equal(out, torch.arange(8) * 2.0)


def _rms_norm_body(fn, x: torch.Tensor, weight: torch.Tensor):
    """A step body calling rms_norm's C function `fn` directly on x [2, 64]."""
    def body() -> torch.Tensor:
        out = torch.empty(2, 64)
        assert fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), 2, 1, 64, 64, 0, 64, 1e-5, 0, 0, 0, 0, 1) == 0
        return out
    return body


def test_a_c_call_the_recorder_cannot_see_fails_the_check_replay():
    """A kernel that calls a ctypes function of its own (not through the library `native.build`
    returned): its call is not recorded, its output would be stale on replay; the NaN-filled check
    replay catches it and the step's logits stay right."""
    norm = _native_rms_norm()
    hidden = norm._LIB.rms_norm.fn                  # the bare ctypes function: invisible to the recorder
    x, weight = torch.randn(2, 64, generator=torch.Generator().manual_seed(0)), torch.ones(64)
    graph, out = step_graph.capture(_rms_norm_body(hidden, x, weight), [x], {})
    assert graph is None
    assert torch.allclose(out, norm.reference(x, weight, 1e-5), atol=1e-5)


def test_a_c_function_not_declared_replayable_is_not_captured(monkeypatch):
    norm = _native_rms_norm()
    monkeypatch.setattr(norm._LIB.rms_norm, "replay", False)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    graph, out = step_graph.capture(lambda: norm.cpu(x, torch.ones(64), 1e-5), [x], {})
    assert graph is None and torch.allclose(out, norm.reference(x, torch.ones(64), 1e-5), atol=1e-5)


def test_a_function_bound_before_the_capture_is_still_recorded():
    """A kernel may bind `_LIB.fn` once (at import) and call it in its steps: the recorder still
    sees the call (it is looked up per call, not swapped into the library), so the step replays."""
    norm = _native_rms_norm()
    x, weight = torch.randn(2, 64, generator=torch.Generator().manual_seed(3)), torch.ones(64)
    graph, out = step_graph.capture(_rms_norm_body(norm._LIB.rms_norm, x, weight), [x], {})
    assert graph is not None and len(graph.calls) == 1
    assert torch.equal(graph.replay([x]), out)


def test_a_kernel_loaded_while_steps_are_recorded_loads_as_written():
    """Issue 32 (3): the lab loads an edited kernel on its worker thread while the engine thread
    records step graphs. Recording once swapped wrappers into the shared libraries, and about half
    of these loads were refused (`'_Watched' object has no attribute 'argtypes'`). Every load must
    succeed, and every capture must still record its C call."""
    norm = _native_rms_norm()
    src = read_source(Path(norm.__file__))
    x, body = _norm_body(norm, 2)
    stop, refused, loads = threading.Event(), [], []

    def load() -> None:
        while not stop.is_set():
            try:
                loads.append(load_source(src, ("cpu",)))
            except ModuleLoadError as e:
                refused.append(str(e))

    loader = threading.Thread(target=load)
    loader.start()
    captures = []
    try:
        while len(loads) + len(refused) < 150:
            graph, out = step_graph.capture(body, x, {})
            captures.append(graph is not None and len(graph.calls) == 1)
            assert torch.allclose(out, norm.reference(x[0], torch.ones(64), 1e-5), atol=1e-5)
    finally:
        stop.set()
        loader.join()
    assert refused == []
    assert captures and all(captures)
    y = loads[-1].module.cpu(x[0], torch.ones(64), 1e-5)   # the last load works as a kernel
    assert torch.allclose(y, norm.reference(x[0], torch.ones(64), 1e-5), atol=1e-5)


def test_a_refused_check_rewinds_the_state_the_body_moved_before_running_it_again():
    """A body whose C calls move state a second run must not move again (a hybrid model's
    recurrent states): the capture saves it through `rewind` and puts it back before the check
    replay (which makes the recorded calls again) and, when the check refuses the graph, before
    the body runs again as usual. Here the state is a tensor a recorded C call adds the normed rows
    into, and the check refuses (a second C call the recorder cannot see): the state ends one
    step on, not two or three."""
    norm = _native_rms_norm()
    x, weight = torch.randn(2, 64, generator=torch.Generator().manual_seed(4)), torch.ones(64)
    state, inner = torch.zeros(2, 64), _rms_norm_body(norm._LIB.rms_norm.fn, x, weight)

    def body() -> torch.Tensor:   # the state: += rms_norm(x), recorded (accum=1)
        assert norm._LIB.rms_norm(x.data_ptr(), weight.data_ptr(), state.data_ptr(), 2, 1, 64, 64, 0, 64, 1e-5,
                                  0, 0, 1, 0, 1) == 0
        return inner()

    def rewind():
        saved = state.clone()
        return lambda: state.copy_(saved)

    graph, out = step_graph.capture(body, [x], {}, rewind)
    want = norm.reference(x, weight, 1e-5)
    assert graph is None and torch.allclose(out, want, atol=1e-5)
    assert torch.allclose(state, want, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_deepseek2_model_replays_its_steps_with_the_same_logits(tmp_path, rows):
    """deepseek2's latent attention (per-head products on moe_matmul, its row joins in C: mla_attention.py)
    and its experts keep a decode step in C calls: replayed, with the same logits bit for bit."""
    from deepseek2_q8 import deepseek2_q8
    from slotserver.model.weights import WeightFormat

    path = deepseek2_q8(tmp_path / "ds.gguf")
    ds = LlamaModel.load(path, torch.float32, max_pos=128, fmt=WeightFormat("q"))
    _replays_the_same(ds, rows, [[t % 300 for t in p] for p in PROMPTS])
