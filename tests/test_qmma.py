"""kernels/qmatmul_gpu.py's int8 tensor-core product (QMMA = "int8", the default from 3 rows of Q4_K
and 5 of Q6_K; it can read 2..16): rows of Q4_K and Q6_K as x's q8_1 rows times each sub-block's unpacked values in int8
tl.dots, scaled after.

Against the float64 product of the same q8_1 x and gguf-py's dequantized weights, with odd N (the
last column block masked), K split over programs (float32 partials) and unsplit (the residual add
in the store), and batch invariance within the regime: rows bit-equal at M = 2, 5 and 16. The
interpreter runs it in a subprocess (this file as a script with TRITON_INTERPRET=1; it runs the
tl.dot in int32 like the card); the sm_90 compile is checked for IMMA and no spills; a CUDA card runs
the same cases compiled (`playground/gpu_check.sh`'s tests part).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slotserver.runtime.qblocks import T, dequantize, random_qweight
from test_qmatmul_gpu import _module, _q8_1_dequant
from triton_script import run_interpreted

MARK = "MMA_RESULTS "
ROWS = (2, 5, 16)


def mma_errors(device: str = "cpu", x_dtype: torch.dtype = torch.float32) -> dict[str, dict]:
    """Per format and K: the split, the relative error against the q8_1 product, invariance, the residual
    add's error."""
    mod, out = _module(), {}
    mod.QMMA, mod.mma.MMA_MIN_M = "int8", {T.Q4_K: 2, T.Q6_K: 2}   # the product itself from 2 rows
    gen = torch.Generator().manual_seed(5)
    # 1 super-block: unsplit (the add fused); 3: split 2 + 1 (a short last split; the plan's own
    # test checks the even splits)
    for qtype, k in ((qt, k) for qt in (T.Q4_K, T.Q6_K) for k in (256, 768)):
        w = random_qweight(gen, qtype, 37, k)
        exact = dequantize(w).double()
        w = type(w)(w.raw.to(device), w.qtype, w.k, w.n)
        x = torch.randn(16, k, generator=gen).to(x_dtype)
        ref = _q8_1_dequant(x) @ exact.T
        scale = 1 + float(ref.abs().max())
        ys = {m: mod.triton(x[:m].to(device), w).cpu() for m in ROWS}
        # a q8_1 given (the norms', lean_step.py) is what is read: 2x's q8_1 (the same q, twice the d) doubles y
        given = mod.triton(x[:5].to(device), w, x_q8=mod.mma._q8_1.q8_1(2 * x[:5].to(device))).cpu()
        acc = torch.randn(3, w.n, generator=gen)
        y_acc = mod.triton(x[:3].to(device), w, acc.to(device).clone()).cpu()
        split = mod.mma.mma_plan(w.n, k, 132, mod.mma.MMA_BLOCK_N[qtype])[2]
        out[f"{qtype.name}/{k}"] = dict(served=mod._mma_ok(x[:2], w), split=split,
                                        err=float((ys[16].double() - ref).abs().max()) / scale,
                                        invariant=all(torch.equal(ys[m], ys[16][:m]) for m in ROWS),
                                        x_q8=torch.equal(given.double(), 2 * ys[5].double()),
                                        acc_err=float((y_acc.double() - ref[:3] - acc.double()).abs().max()) / scale)
    return out


@pytest.fixture(scope="module")
def interpreted(triton_interpreter) -> dict:
    return run_interpreted(__file__, MARK)


def test_the_int8_product_matches_the_q8_1_product_split_or_not_and_is_batch_invariant(interpreted):
    assert [interpreted[f"{q}/{k}"]["split"] for q in ("Q4_K", "Q6_K") for k in (256, 768)] == [1, 2] * 2
    for k, c in interpreted.items():
        assert c["served"] and c["invariant"] and c["x_q8"], (k, c)
        assert c["err"] < 1e-5 and c["acc_err"] < 1e-5, (k, c)   # float32 scaling of exact int32 dots


def test_the_int8_product_serves_q4_k_from_3_rows_and_q6_k_from_5_by_default(monkeypatch):
    mod, gen = _module(), torch.Generator().manual_seed(6)
    assert mod.QMMA == "int8"
    w, w6 = random_qweight(gen, T.Q4_K, 4, 256), random_qweight(gen, T.Q6_K, 4, 256)   # Q6_K: byte loads
    assert mod._mma_ok(torch.zeros(3, 256), w) and mod._mma_ok(torch.zeros(16, 256), w)
    assert not mod._mma_ok(torch.zeros(2, 256), w) and not mod._mma_ok(torch.zeros(17, 256), w)   # 1-2: the wide GEMV
    assert mod._wide_ok(torch.zeros(2, 256), w)
    assert mod._mma_ok(torch.zeros(5, 256), w6) and not mod._mma_ok(torch.zeros(4, 256), w6)
    assert not mod._mma_ok(torch.zeros(4, 256), random_qweight(gen, T.Q8_0, 4, 256))
    mod.QMMA = "off"
    assert not mod._mma_ok(torch.zeros(4, 256), w)
    monkeypatch.setenv("SLOTSERVER_QMMA", "off")
    assert mod._qmma_mode() == "off"
    monkeypatch.setenv("SLOTSERVER_QMMA", "fp8")
    with pytest.raises(ValueError, match="SLOTSERVER_QMMA='fp8'"):
        mod._qmma_mode()


def test_the_plan_fills_the_card_and_keeps_two_super_blocks_a_split():
    mod = _module()
    for n, k, bn in ((n, k, bn) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (896, 4864))
                     for bn in set(mod.mma.MMA_BLOCK_N.values())):
        tiles, sb_split, split = mod.mma.mma_plan(n, k, 132, bn)
        assert (split - 1) * sb_split < k // 256 <= split * sb_split, (n, k, sb_split, split)   # every block once
        assert sb_split >= 2 or k // 256 < 2, (n, k, sb_split)
        assert tiles * split >= mod.mma.MMA_PROGRAMS_PER_SM * 132 // 2 or sb_split == 2, (n, k, tiles, split)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=["Q4_K", "Q6_K"])
def test_the_sm90_compile_runs_int8_tensor_core_mma_without_spills(qtype):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    from slotserver.lab.aot import compile_for
    from slotserver.runtime import lazy_triton

    nvbin = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not nvbin.exists():
        pytest.skip("triton ships no cuobjdump here")
    fn, sig, consts, opts = _module().mma._mma_aot(qtype)
    fn = lazy_triton.resolve(fn)
    res = compile_for(fn, sig, consts, 90, opts)
    assert res.spill_stores == res.spill_loads == 0, res
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in opts["aligned"]}
    compiled = triton.compile(triton.compiler.ASTSource(fn, {a: sig[a] for a in fn.arg_names}, consts, attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": opts["num_warps"]})
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"qmma-{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(nvbin), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    cubin.unlink()
    assert len(re.findall(r"\bIMMA\.16832\.S8\.S8", sass)) >= 2, "no int8 mma in the sm_90 SASS"
    assert "HMMA" not in sass   # no float dot: the scales are applied after the integer one


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_on_the_card_the_int8_product_matches_and_is_batch_invariant(x_dtype):
    for k, c in mma_errors("cuda", x_dtype).items():
        assert c["served"] and c["invariant"] and c["x_q8"], (k, c)
        tol = 1e-5 if x_dtype == torch.float32 else 1e-2   # bf16: the output's rounding and x's own
        assert c["err"] < tol and c["acc_err"] < tol, (k, c)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(MARK + json.dumps(mma_errors()))
