"""The native K/V row writer stores exactly what torch's cast + index_put_ stores (the bytes a
later attention step reads back), in every cache dtype, through contiguous and strided views, and
refuses an out-of-range stream or position instead of writing outside the cache."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from slotserver.runtime import kv_rows, native

needs_c = pytest.mark.skipif(kv_rows._LIB is None, reason="no C compiler: the torch form (index_put_) serves")


def _values(n: int, seed: int) -> torch.Tensor:
    """Floats over float16's whole range: subnormals, halfway cases, overflow, signed zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-30, 18, (n,), generator=gen).float())
    special = torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, -65536.0, 2.0 ** -24, 2.0 ** -25,
                            3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1.0 + 2.0 ** -11, float("inf")])
    return torch.cat([special, x])[:n]


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads_first", [False, True], ids=["seq_head_dim", "head_seq_dim"])
def test_rows_land_bit_exact(dtype, heads_first):
    streams, cells, heads, dim = 4, 9, 3, 40
    shape = (streams, heads, cells, dim) if heads_first else (streams, cells, heads, dim)
    want_k, want_v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    got_k, got_v = want_k.clone(), want_v.clone()
    view = (lambda t: t.transpose(1, 2)) if heads_first else (lambda t: t)   # logical [stream, cell, head, dim]
    vals = _values(5 * heads * dim * 2, seed=int(heads_first))
    k, v = vals[: 5 * heads * dim].view(5, heads, dim), vals[5 * heads * dim:].view(5, heads, dim)
    for src in (torch.float32, torch.bfloat16):
        st, pos = torch.tensor([0, 3, 1, 3, 2]), torch.tensor([8, 0, 4, 1, 8])
        kv_rows.write_rows(view(got_k), view(got_v), st, pos, k.to(src), v.to(src))
        view(want_k).index_put_((st, pos), k.to(src).to(dtype))
        view(want_v).index_put_((st, pos), v.to(src).to(dtype))
        assert torch.equal(_bits(got_k), _bits(want_k)) and torch.equal(_bits(got_v), _bits(want_v)), (dtype, src)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@needs_c
def test_out_of_range_rows_are_refused_and_nothing_outside_is_written():
    k_dst, v_dst = torch.zeros(2, 5, 1, 8, dtype=torch.float16), torch.zeros(2, 5, 1, 8, dtype=torch.float16)
    rows = torch.ones(1, 1, 8)
    for st, pos in (([2], [0]), ([0], [5]), ([-1], [0])):
        with pytest.raises(IndexError, match="out of range"):
            kv_rows.write_rows(k_dst, v_dst, torch.tensor(st), torch.tensor(pos), rows, rows)
    assert not k_dst.any() and not v_dst.any()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the portable (no F16C) form")
def test_portable_half_conversion_matches_torch(tmp_path):
    """Off x86 (no F16C) the C converts to float16 by integer arithmetic: same bits as torch."""
    src = tmp_path / "f2h.c"
    src.write_text(native.PRELUDE + kv_rows.NATIVE_C
                   + "void f2h_many(const float *x, uint16_t *o, int64_t n) { for (int64_t i = 0; i < n; i++) o[i] = f2h(x[i]); }\n")
    lib = tmp_path / "f2h.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-mno-f16c", "-mno-avx", str(src), "-o", str(lib), "-lm"],
                   check=True, capture_output=True)
    f = ctypes.CDLL(str(lib)).f2h_many
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = torch.cat([_values(200_000, seed=7), -_values(1000, seed=8)])
    # every float16 halfway point below 2^-13, both sides: the subnormal rounding
    grid = torch.arange(0, 4096, dtype=torch.float64) * 2.0 ** -25
    x = torch.cat([x, grid.float(), (grid + 2.0 ** -40).float(), (grid - 2.0 ** -40).clamp_min(0).float()])
    out = torch.empty(x.shape, dtype=torch.int16)
    f(x.data_ptr(), out.data_ptr(), x.numel())
    assert torch.equal(out, x.to(torch.float16).view(torch.int16))
    nan = torch.tensor([float("nan")])
    f(nan.data_ptr(), out.data_ptr(), 1)
    assert torch.isnan(out[:1].view(torch.float16)).all()


_TRITON_WRITE = """
import torch
from slotserver.runtime import kv_rows_triton as kt
g = torch.Generator().manual_seed(0)
store = torch.zeros(2, 3, 5, 16, 8, dtype=torch.float16)   # [k|v, stream, head, cell, dim]: head_seq_dim
kd, vd = store[0].transpose(1, 2), store[1].transpose(1, 2)  # logical [stream, cell, head, dim], strided
qkv = torch.randn(4, 3 * 5, 8, generator=g).bfloat16()        # k, v: slices of a fused projection
k, v = qkv[:, 5:10], qkv[:, 10:]
streams, pos = torch.tensor([0, 2, 1, 2]), torch.tensor([3, 15, 0, 7])
assert kt.fits(kd, vd, streams, pos, k, v)
kt.write(kd, vd, streams, pos, k, v)
ek, ev = torch.zeros_like(kd), torch.zeros_like(vd)
ek.index_put_((streams, pos), k.to(ek.dtype))
ev.index_put_((streams, pos), v.to(ev.dtype))
assert torch.equal(kd, ek) and torch.equal(vd, ev), "not index_put_'s bytes"
kt.write(kd, vd, torch.tensor([5]), torch.tensor([0]), k[:1], v[:1])   # stream 5 of 3: not written
assert torch.equal(kd, ek), "an out-of-range row was written"
print("ok")
"""


def test_the_gpu_write_stores_index_puts_bytes():
    """The CUDA path's one Triton launch (runtime/kv_rows_triton.py), run by Triton's interpreter on
    CPU tensors in a process of its own: the bytes of a cast + index_put_ into a strided view, and
    a row outside the cache dropped rather than written past it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_WRITE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
