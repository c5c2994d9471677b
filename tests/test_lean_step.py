"""The Triton body with fewer launches (model/lean_step.py, the CUDA path): the same logits and
greedy tokens as the unfused body, and 4 fewer launches a layer, as playground/decode_launches.py
counts them; rms_norm's `add` / `out_dtype` fusions give the unfused floats.

The model runs on CPU tensors with the Triton kernels under triton's interpreter, in a subprocess
(this file run as a script with TRITON_INTERPRET=1: triton fixes interpret-or-compile at its first
import). The bit-identity is checked in float32: the interpreter rounds float32 -> bf16 stores by
truncation (a GPU rounds to nearest even, as torch's casts), so in bf16 an interpreted fused cast
and torch's cast differ by an ulp, which a GPU does not show.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from triton_script import run_interpreted

ROOT = Path(__file__).resolve().parents[1]
MARK = "LEAN-STEP "
PROMPTS = [[5, 17, 200, 33, 1, 90], [7, 8, 9]]


def _interpreted(gguf: Path) -> dict:
    """Runs under TRITON_INTERPRET=1: logits and tokens of both bodies (float32), launch counts (bf16)."""
    sys.path.insert(0, str(ROOT / "playground"))
    import decode_launches as dl
    from slotserver.model.generate import GenRequest, generate
    from slotserver.model import lean_step

    out: dict = {"counts": {}, "tokens": {}, "logits": {}, "applies": {}, "kernel": _fused_triton_errors()}
    for variant in ("lean", "unfused"):
        out["counts"][variant] = dl.count_step(dl.load(gguf, "cpu", variant == "unfused"), 1, 3)
        model = dl.load(gguf, "cpu", variant == "unfused", torch.float32)
        out["applies"][variant] = lean_step.applies(model, model.kernels)
        reqs = [GenRequest(list(p), 3, ignore_eos=True) for p in PROMPTS]
        out["tokens"][variant] = [r.tokens for r in generate(model, reqs, frozenset())]
        cache, step = dl.decode_batch(model, 2, 7, together=True)
        out["logits"][variant] = model.forward(step, cache).tolist()
    return out


def _fused_triton_errors() -> dict:
    """rms_norm's Triton `add` + `out_dtype` against the reference, per output dtype: the residual's
    largest difference after the add, and the normed rows' relative one, |d| / (1 + |ref|) (ragged
    widths, a 1000-column row)."""
    from slotserver.runtime.kernel_set import KERNEL_CONTRACT
    from slotserver.runtime.loader import default_dir, load_by_path

    mod = load_by_path(default_dir("kernels") / "rms_norm.py", KERNEL_CONTRACT).module
    gen, errors = torch.Generator().manual_seed(11), {}
    for out_dtype in (torch.float32, torch.bfloat16):
        worst = [0.0, 0.0]
        for rows, dim in ((1, 64), (3, 37), (2, 1000)):
            x, y = torch.randn(rows, dim, generator=gen), torch.randn(rows, dim, generator=gen).bfloat16()
            w = 1 + 0.1 * torch.randn(dim, generator=gen)
            xa, xb = x.clone(), x.clone()
            got = mod.triton(xa, w, 1e-6, add=y, out_dtype=out_dtype)
            want = mod.reference(xb, w, 1e-6, add=y, out_dtype=out_dtype)
            assert got.dtype == want.dtype == out_dtype
            worst[0] = max(worst[0], float((xa - xb).abs().max()))
            worst[1] = max(worst[1], float(((got.float() - want.float()).abs() / (1 + want.float().abs())).max()))
        errors[str(out_dtype)] = worst
    return errors


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    from tiny_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path_factory.mktemp("lean") / "q.gguf", arch="qwen2", qkv_bias=True, d_model=64)
    return run_interpreted(__file__, MARK, gguf)


def test_the_lean_body_gives_the_unfused_logits_and_tokens(interpreted):
    """qwen2 (q/k/v biases) on the Triton kernels: a prefill + decode generation and a batch of
    two decode rows give the same floats whether rms_norm fuses the add and the cast or not."""
    assert interpreted["applies"] == {"lean": True, "unfused": False}   # an rms_norm without the FUSES: _body
    assert interpreted["tokens"]["lean"] == interpreted["tokens"]["unfused"]
    lean, unfused = torch.tensor(interpreted["logits"]["lean"]), torch.tensor(interpreted["logits"]["unfused"])
    assert lean.shape == (2, unfused.shape[1]) and torch.equal(lean, unfused)


def test_the_fused_triton_norm_adds_in_place_and_stores_the_asked_dtype(interpreted):
    """The residual after the kernel is torch's float32 add exactly; the normed rows are the
    reference's within a rounding (bf16: the interpreter truncates where a GPU rounds)."""
    errors = interpreted["kernel"]
    assert errors["torch.float32"][0] == errors["torch.bfloat16"][0] == 0.0
    assert errors["torch.float32"][1] < 1e-6 and errors["torch.bfloat16"][1] <= 2 ** -7   # one bf16 ulp


def test_the_lean_body_makes_four_fewer_launches_a_layer(interpreted):
    """What decode_launches.py reports: the residual adds and the casts after the norms are gone
    (two adds and two casts a layer, and the output norm's cast); the rest is unchanged."""
    lean, unfused = interpreted["counts"]["lean"], interpreted["counts"]["unfused"]
    layers = lean["n_layers"]
    assert unfused["launches_per_step"] - lean["launches_per_step"] == 4 * layers + 1
    assert "aten.add_" not in lean["ops"] and unfused["ops"]["aten.add_"] == 2 * layers
    assert lean["ops"]["triton._rms_norm_kernel"] == unfused["ops"]["triton._rms_norm_kernel"] == 2 * layers + 1
    assert lean["ops"]["aten.linear"] == 4 * layers + 1                 # the bias rides in F.linear
    assert unfused["ops"]["aten.to"] - lean["ops"]["aten.to"] == 2 * layers + 1


@pytest.mark.parametrize("form", ["native", "torch"])
def test_rms_norm_add_and_out_dtype_give_the_unfused_floats(form):
    """x += y; h = rms_norm(x) stored in bf16: the residual after is torch's add, h is the norm of
    it cast by torch, for the CPU implementation (C and torch forms) and the reference."""
    from slotserver.runtime.kernel_set import KERNEL_CONTRACT
    from slotserver.runtime.loader import default_dir, load_by_path

    mod = load_by_path(default_dir("kernels") / "rms_norm.py", KERNEL_CONTRACT).module
    if form == "native" and mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    if form == "torch":
        mod._LIB = None
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 96, generator=gen), torch.randn(5, 96, generator=gen).bfloat16()
    w = 1 + 0.1 * torch.randn(96, generator=gen)
    for fn in (mod.cpu, mod.reference):
        residual = x.clone()
        h = fn(residual, w, 1e-6, add=y, out_dtype=torch.bfloat16)
        assert torch.equal(residual, x + y.float())
        assert h.dtype == torch.bfloat16 and torch.equal(h, fn(x + y.float(), w, 1e-6).bfloat16())


if __name__ == "__main__":
    print(MARK + json.dumps(_interpreted(Path(sys.argv[1]))))
