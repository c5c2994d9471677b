"""kernels/gemv.py, the fused small-M GEMV: each fusion against the unfused ops it replaces (F.linear,
then the rms_norm / silu_mul / gelu_mul / rope kernels' own references, then `x += y`), at one row
(the broadcast product) and at 3, 8 and 16 rows (tl.dot on 16), odd widths, float32 and bf16; its
tiling; and its sm_90 compile (16-byte weight loads, no spills).

The Triton kernel runs under triton's interpreter in a subprocess (this file as a script with
TRITON_INTERPRET=1: triton fixes interpret-or-compile at its first import). In bf16 the
interpreter rounds float32 -> bf16 stores by truncation where a GPU (and torch) rounds to nearest,
so bf16 results may differ from the unfused torch ops by an ulp or two of the chained roundings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import default_dir, load_by_path
from triton_script import run_interpreted

MARK = "GEMV "
ROWS = (1, 3, 8, 16)
CASES = ("plain", "bias", "norm+silu", "gelu", "norm+bias+rope", "acc")


def _kernel(name: str):
    return load_by_path(default_dir("kernels") / f"{name}.py", KERNEL_CONTRACT).module


def _unfused(case: str, m: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[tuple, torch.Tensor]:
    """(gemv's arguments, the unfused ops' result) for one case: N 37 (gate|up: 2 x 37), K 45."""
    n, k, eps, hd = 37, 45, 1e-6, 8
    x = torch.randn(m, k, generator=gen)
    w = (torch.randn(2 * n if case in ("norm+silu", "gelu") else n, k, generator=gen) / k ** 0.5).to(dtype)
    b, nw = torch.randn(n, generator=gen).to(dtype), 1 + 0.1 * torch.randn(k, generator=gen)
    h = _kernel("rms_norm").reference(x.clone(), nw, eps, out_dtype=dtype)      # the normed rows, rounded
    if case == "plain":
        return (x.to(dtype), w), F.linear(x.to(dtype), w)
    if case == "bias":
        return (x.to(dtype), w, b), F.linear(x.to(dtype), w, b)
    if case == "norm+silu":
        return (x, w, None, "silu", nw, eps), _kernel("silu_mul").reference(F.linear(h, w))
    if case == "gelu":
        return (x.to(dtype), w, None, "gelu"), _kernel("gelu_mul").reference(F.linear(x.to(dtype), w))
    if case == "norm+bias+rope":   # 3 q|k heads of 8 (3 of their 4 pairs turned), then 13 v columns
        theta = torch.rand(m, 3, generator=gen) * 10
        y = F.linear(h, w, b)
        qk = _kernel("rope").reference(y[:, :24].reshape(m, 3, hd), theta.cos(), theta.sin())
        return (x, w, b, "", nw, eps, None, theta.cos(), theta.sin(), hd, 24), torch.cat([qk.flatten(1), y[:, 24:]], 1)
    residual = torch.randn(m, n, generator=gen)
    return (x.to(dtype), w, None, "", None, eps, residual.clone()), residual + F.linear(x.to(dtype), w).float()


def _interpreted() -> dict:
    """Runs under TRITON_INTERPRET=1: per dtype, case and row count, gemv's largest relative error
    |got - want| / (1 + |want|) against the unfused ops, and whether `acc` came back as itself."""
    mod, out = _kernel("gemv"), {"errors": {}, "acc_in_place": True}
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(5)
        for case in CASES:
            for m in ROWS:
                args, want = _unfused(case, m, dtype, gen)
                got = mod.triton(*args)
                assert got.shape == want.shape and got.dtype == want.dtype, (case, got.shape, want.shape, got.dtype)
                if case == "acc":
                    out["acc_in_place"] &= got is args[6]
                err = float(((got.float() - want.float()).abs() / (1 + want.float().abs())).max())
                out["errors"][f"{dtype}/{case}/{m}"] = err
    return out


@pytest.fixture(scope="module")
def interpreted(triton_interpreter) -> dict:
    return run_interpreted(__file__, MARK)


@pytest.mark.parametrize("case", CASES)
def test_each_fusion_gives_the_unfused_ops_floats(interpreted, case):
    """float32: the unfused result within float32 summation order; bf16: within four bf16 ulps
    (2^-5 relative: the interpreter truncates the two or three chained roundings a GPU rounds to
    nearest; measured up to 1.8e-2, norm + silu at 16 rows). A wrong row, column or pair is O(1)."""
    for m in ROWS:
        assert interpreted["errors"][f"torch.float32/{case}/{m}"] < 1e-5, (case, m)
        assert interpreted["errors"][f"torch.bfloat16/{case}/{m}"] <= 2 ** -5, (case, m)


def test_the_residual_add_updates_acc_in_place(interpreted):
    assert interpreted["acc_in_place"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES)
def test_each_fusion_gives_the_unfused_ops_floats_on_the_card(case):
    """Compiled for the card: float32 as interpreted; bf16 within two ulps of the chained roundings
    (the card rounds to nearest, as torch does; the sums' order still differs)."""
    mod, gen = _kernel("gemv"), torch.Generator().manual_seed(6)
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2 ** -6)):
        for m in ROWS:
            args, want = _unfused(case, m, dtype, gen)
            got = mod.triton(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)).cpu()
            err = float(((got.float() - want.float()).abs() / (1 + want.float().abs())).max())
            assert got.dtype == want.dtype and err <= bound, (case, dtype, m, err)


def test_the_tiling_fills_the_card_and_respects_tl_dot():
    """One row: the broadcast product, BLOCK_N shrunk until about 2 programs an SM (Qwen2.5-0.5B's
    down, N 896: 2-column programs, 448 of them); more than 4 rows: tl.dot tiles of 16 at least."""
    mod = _kernel("gemv")
    down = mod.plan(1, 896, 4864, 132)
    assert not down.dot and down.block_n == 2 and 896 // down.block_n >= 2 * 132
    llama_down = mod.plan(1, 4096, 14336, 132)
    assert 4096 // llama_down.block_n >= 2 * 132 and llama_down.block_k <= 4096
    for m in (5, 8, 16):
        p = mod.plan(m, 4864, 896, 132, glu=True)
        assert p.dot and min(p.block_m, p.block_n, p.block_k) >= 16 and p.block_m >= m
    with pytest.raises(ValueError, match="tl.dot needs every block >= 16"):
        mod.GemvPlan(16, 8, 64, True)
    with pytest.raises(AssertionError, match="at most 16 rows"):
        mod.triton(torch.zeros(17, 8), torch.zeros(4, 8))


def test_the_sm90_compile_loads_weights_16_bytes_at_a_time_without_spills():
    """ptxas on the served b=1 down (x += y) and gate|up (norm + silu) launches: 16-byte loads, no
    spills, no per-step barriers, where the JIT sees the served shapes' alignment (`aligned`)."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget

    from slotserver.lab.aot import compile_for
    from slotserver.runtime import lazy_triton

    mod, nvbin = _kernel("gemv"), Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not nvbin.exists():
        pytest.skip("triton ships no cuobjdump here")
    for fn, sig, consts, opts in (mod.AOT[2], mod.AOT[3]):
        fn = lazy_triton.resolve(fn)
        res = compile_for(fn, sig, consts, 90, opts)
        assert res.spill_stores == res.spill_loads == 0 and res.regs <= 128, res
        options = {k: v for k, v in opts.items() if k != "aligned"}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in opts["aligned"]}
        compiled = triton.compile(triton.compiler.ASTSource(fn, {a: sig[a] for a in fn.arg_names}, consts, attrs),
                                  target=GPUTarget("cuda", 90, 32), options=options)
        cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"gemv-{os.getpid()}.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(nvbin), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        cubin.unlink()
        loads = re.findall(r"\bLDG\.E[.\w]*", sass)
        assert loads.count("LDG.E.128") >= 4 and "LDG.E.U16" not in loads, loads
        # the K loop re-lays nothing through shared memory and reduces once, after it: 14 and 24
        # barriers when x's tile was converted and the sum taken every step
        assert sass.count("BAR.SYNC") <= 4, sass.count("BAR.SYNC")


if __name__ == "__main__":
    print(MARK + json.dumps(_interpreted()))
