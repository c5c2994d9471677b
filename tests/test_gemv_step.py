"""The fused-GEMV decode body (model/gemv_step.py, `fused_gemv` on): the lean body's greedy tokens and
logits, 6 launches a layer (the lean body's 10) as playground/decode_launches.py counts them, taken only for
steps of at most gemv's SMALL_M rows with the switch on.

The model runs on CPU tensors with the Triton kernels under triton's interpreter, in a subprocess
(this file as a script with TRITON_INTERPRET=1), in float32 (the interpreter truncates bf16 roundings
where a GPU rounds to nearest: tests/test_lean_step.py). Two tiny models: qwen2 with q/k/v biases
and a partial rotary (8 of 16 dims: rope's pass-through pairs), and qwen3's per-head q/k norms
(qkv without the rope epilogue, the model's own norm + rope after).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from slotserver.runtime import native
from triton_script import run_interpreted

ROOT = Path(__file__).resolve().parents[1]
MARK = "GEMV-STEP "
PROMPTS = [[5, 17, 200, 33, 1, 90], [7 + i for i in range(20)]]   # the 20-token prefill: past SMALL_M


def _run(gguf: Path, logits: bool) -> dict:
    """Both bodies' greedy tokens, and (`logits`) a 2-row decode step's logits, with the launches of
    the GEMV body's step counted as decode_launches.py counts them (float32)."""
    sys.path.insert(0, str(ROOT / "playground"))
    import decode_launches as dl
    from slotserver.model.generate import GenRequest, generate

    out: dict = {"tokens": {}, "logits": {}, "ops": {}}
    for variant in ("lean", "gemv"):
        model = dl.load(gguf, "cpu", False, torch.float32, gemv=variant == "gemv")
        reqs = [GenRequest(list(p), 2, ignore_eos=True) for p in PROMPTS]
        out["tokens"][variant] = [r.tokens for r in generate(model, reqs, frozenset())]
        if logits:
            cache, step = dl.decode_batch(model, 2, 7, together=True)   # its prefill: 14 rows, no logits rows
            with dl.LaunchCounter() as counter:
                out["logits"][variant] = model.forward(step, cache).tolist()
            out["ops"][variant] = dict(Counter(counter.names))
    out["n_layers"] = model.spec.n_layers
    return out


def _interpreted(qwen2: Path, qwen3: Path) -> dict:
    """Runs under TRITON_INTERPRET=1: both models' runs and `applies`."""
    sys.path.insert(0, str(ROOT / "playground"))
    import decode_launches as dl
    from slotserver.model import gemv_step
    from slotserver.runtime.batch import Batch, SeqChunk

    out = {"qwen2": _run(qwen2, True), "qwen3": _run(qwen3, False)}
    model = dl.load(qwen2, "cpu", False, torch.float32, gemv=True)
    rows = {n: Batch.build([SeqChunk(0, 0, list(range(3, 3 + n)))], "cpu") for n in (16, 17)}
    out["applies"] = {n: gemv_step.applies(model, model.kernels, b) for n, b in rows.items()}
    model.fused_gemv = False
    out["applies_off"] = gemv_step.applies(model, model.kernels, rows[16])
    return out


@pytest.fixture(scope="module")
def interpreted(triton_interpreter, tmp_path_factory) -> dict:
    from tiny_gguf import write_tiny_gguf

    folder = tmp_path_factory.mktemp("gemv")
    qwen2 = write_tiny_gguf(folder / "qwen2.gguf", arch="qwen2", qkv_bias=True, head_dim=16, n_layers=1,
                            **{"qwen2.rope.dimension_count": 8})
    qwen3 = write_tiny_gguf(folder / "qwen3.gguf", arch="qwen3", features=("qk_norm",), n_layers=1)
    return run_interpreted(__file__, MARK, qwen2, qwen3)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_the_gemv_body_gives_the_lean_bodys_tokens_and_logits(interpreted, arch):
    """Greedy generation (a 6-token prompt through the GEMV body, a 20-token one through cuBLAS's
    lean body, then decode steps) and a 2-row decode step: the same tokens, logits within float32
    summation order (the GEMV sums K in another order than torch's matmul)."""
    run = interpreted[arch]
    assert run["tokens"]["gemv"] == run["tokens"]["lean"]
    if arch == "qwen3":   # tokens only (the interpreter's minutes are the suite's)
        return
    lean, gemv = torch.tensor(run["logits"]["lean"]), torch.tensor(run["logits"]["gemv"])
    assert gemv.shape == lean.shape == (2, lean.shape[1])
    torch.testing.assert_close(gemv, lean, atol=1e-4, rtol=1e-4)


def test_the_gemv_body_makes_six_launches_a_layer(interpreted):
    """What decode_launches.py counts (a 2-row decode step): per layer the 4 matmuls are 4 gemv
    launches and the 2 norms, rope and silu_mul are gone into them (the lean body's 10 a layer: 2
    norms, 4 matmuls, rope, K/V write, attention, silu_mul); the output norm and matmul stay."""
    run = interpreted["qwen2"]
    lean, gemv, layers = run["ops"]["lean"], run["ops"]["gemv"], run["n_layers"]
    assert gemv["triton._gemv_kernel"] == 4 * layers
    assert gemv["aten.linear"] == gemv["triton._rms_norm_kernel"] == 1   # the output's
    assert "triton._rope_kernel" not in gemv and "triton._silu_mul_kernel" not in gemv
    assert gemv["triton._attn_decode_kernel"] == layers
    kv = "native.kv_write_rows"   # the C K/V write (SLOTSERVER_NATIVE=0: torch ops, the same in both bodies)
    assert gemv.get(kv) == lean.get(kv) and (gemv[kv] == layers if native.enabled() else kv not in gemv)
    assert sum(lean.values()) - sum(gemv.values()) == 4 * layers
    assert lean["aten.linear"] == 4 * layers + 1 and lean["triton._rms_norm_kernel"] == 2 * layers + 1


def test_the_gemv_body_serves_only_small_steps_with_the_switch_on(interpreted):
    assert interpreted["applies"] == {"16": True, "17": False}
    assert interpreted["applies_off"] is False


def test_the_switch_is_off_by_default_and_reaches_the_model_from_the_flag(tmp_path):
    """`--fused-gemv on` -> ModelConfig.fused_gemv -> the loaded model's `fused_gemv`; off unless asked;
    a non-bool refused. (On the CPU the model keeps its own body whatever the switch says.)"""
    from tiny_gguf import write_tiny_gguf

    from slotserver.cli import main as cli
    from slotserver.errors import ConfigError
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig
    from slotserver.server.config_from_args import plan_from_args

    path = write_tiny_gguf(tmp_path / "m.gguf")
    parse = lambda *a: plan_from_args(cli.build_parser().parse_args(["serve", "-m", str(path), *a])).model  # noqa: E731
    assert parse().fused_gemv is False and parse("--fused-gemv", "on").fused_gemv is True
    assert ModelBundle.load(parse("--fused-gemv", "on")).model.fused_gemv is True
    assert ModelBundle.load(ModelConfig(path)).model.fused_gemv is False
    with pytest.raises(ConfigError, match="fused_gemv must be a bool"):
        ModelConfig(path, fused_gemv="on")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_card_the_gemv_body_gives_the_lean_tokens_and_replays_as_eager(tmp_path):
    """float32: fused_gemv on and off give the same greedy tokens; bf16 with it on: CUDA-graph
    replays give the eager steps' tokens (across a context bucket, two batch sizes)."""
    from tiny_gguf import write_tiny_gguf

    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig
    from slotserver.model.generate import GenRequest, generate

    path = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", qkv_bias=True, ctx_len=1024)
    reqs = [GenRequest(list(range(5, 250)), 30, ignore_eos=True), GenRequest([7, 8, 9], 30, ignore_eos=True)]
    tokens = {}
    for on in (False, True):
        model = ModelBundle.load(ModelConfig(path, device="cuda", dtype="float32", gpu_weights="dense",
                                             fused_gemv=on)).model
        tokens[on] = [r.tokens for r in generate(model, reqs, frozenset())]
    assert tokens[True] == tokens[False]
    model = ModelBundle.load(ModelConfig(path, device="cuda", dtype="auto", gpu_weights="dense", fused_gemv=True)).model
    model.set_step_graphs(False)
    eager = [r.tokens for r in generate(model, reqs, frozenset())]
    model.set_step_graphs(True)
    assert [r.tokens for r in generate(model, reqs, frozenset())] == eager
    assert model.graphs.replays > 20


if __name__ == "__main__":
    print(MARK + json.dumps(_interpreted(Path(sys.argv[1]), Path(sys.argv[2]))))
