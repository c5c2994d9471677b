"""kernels/qmatmul.py: `x @ W^T` on raw GGUF blocks, for every format.

- cpu vs the float32 reference (gguf's dequantizer) within TOL, both dtypes, M = 1, 3, 17, 64
  (17 and 64 take the dequantize-a-tile path for most formats: PREFILL_ROWS);
- the C integer path vs a Python model of the same 8-bit activation quantization, tightly (1e-4
  of the output scale, while the 8-bit error itself is ~1e-2): a wrong scale, min, nibble order
  or sum in any format shows here even where TOL would hide it;
- the same under SLOTSERVER_CPU=avx2 and with the portable C (no SIMD), and the torch fallback
  (SLOTSERVER_NATIVE=0);
- a weight that is a view of an np.memmap'd GGUF file (gguf.GGUFWriter) is read in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import gguf
import numpy as np
import pytest
import torch

from slotserver.runtime import native_cache
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.lab.check import compare_outputs
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import FLOATS, KQUANTS, QUANTIZED, T, QWeight, dequantize, random_qweight

PATH = default_dir("kernels") / "qmatmul.py"
ALL = QUANTIZED + tuple(FLOATS)


def _load():
    return load_by_path(PATH, KERNEL_CONTRACT).module


@pytest.fixture(scope="module")
def mod():
    return _load()


def _case(qtype, m: int, n: int = 37, k: int = 512, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed * 1000 + int(qtype) * 10 + m)
    return torch.randn(m, k, generator=gen).to(dtype), random_qweight(gen, qtype, n, k)


def int8_model(x: torch.Tensor, w: QWeight, block: int | None = None) -> np.ndarray:
    """What the C computes, in numpy: activations quantized per block (32, or 256 for K-quants),
    d = amax * (1/127) in float32, q = round-half-even(x * (1/d)), then an exact float64 matmul
    with the dequantized weight (the C's integer dots are exact; only its float32 sums round)."""
    block = block or (256 if w.qtype in KQUANTS else 32)
    m = x.shape[0]
    xf = x.float().numpy().reshape(m, -1, block)
    d = np.abs(xf).max(-1, keepdims=True) * np.float32(1 / 127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xf * inv), -127, 127)
    xq = (q.astype(np.float64) * d.astype(np.float64)).reshape(m, -1)
    return xq @ dequantize(w).numpy().astype(np.float64).T


@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("qtype", ALL, ids=lambda t: T(t).name)
def test_cpu_matches_reference(mod, qtype, m):
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _case(qtype, m, dtype=dtype)
        got, want = mod.cpu(x, w), mod.reference(x, w)
        assert got.shape == (m, w.n) and got.dtype == dtype
        err, ok = compare_outputs(got, want, mod.TOL[dtype])
        assert ok, f"{w.name} m={m} {dtype}: max error {err:.3g} > {mod.TOL[dtype]}"


def _assert_integer_path(mod, qtype, ms=(1, 3, 17)):
    """C result == the int8 model within 1e-4 of the output scale; the model itself is ~1e-2 away
    from the float32 reference (so this check is 100x tighter than TOL)."""
    for m in ms:
        x, w = _case(qtype, m, k=768 if qtype in KQUANTS else 544, seed=1)
        got = mod._int_dots(x, w).double().numpy()   # whatever PREFILL_ROWS says
        # K formats on the repacked form have their activations quantized per 32
        model = int8_model(x, w, 32 if mod.repacked_serves(w, m) else None)
        scale = np.abs(model).max()
        assert np.abs(got - model).max() <= 1e-4 * scale, f"{w.name} m={m}: {np.abs(got - model).max():.3g}"
        assert np.abs(model - mod.reference(x, w).double().numpy()).max() > 1e-3 * scale   # the 8-bit step is real


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: T(t).name)
def test_integer_path_equals_python_model(mod, qtype):
    if mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    _assert_integer_path(mod, qtype)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: T(t).name)
def test_dequantize_tiles_equal_gguf(mod, qtype):
    """The prefill path's C dequantizer gives gguf's values (float32: exactly up to one rounding)."""
    if mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    _, w = _case(qtype, 1, n=9, k=768)
    out = torch.empty(7, w.k)
    block_bytes = gguf.GGML_QUANT_SIZES[T(qtype)][1]
    mod._LIB.qdequant(w.raw.data_ptr(), out.data_ptr(), 2, 9, w.k, w.raw.stride(0), block_bytes, w.qtype, 0, 1)
    torch.testing.assert_close(out, dequantize(w, 2, 9), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: T(t).name)
def test_compact_repacked_forms_give_the_byte_forms_floats(mod, qtype, m):
    """The 4/5-bit and float16-scale forms (what serves a format where the CPU has them: fewer
    bytes a step) compute the same integer dots and scales as the float32 byte form: the same
    floats, bit for bit, wherever both serve the format here."""
    form = mod._R16_FORM.get(T(qtype)) if mod._LIB is not None else None
    byte_form = 2 if qtype == T.Q6_K else 0
    if form in (None, 0, 2) or not mod._LIB.qmatmul_r16_serves(int(qtype), byte_form):
        pytest.skip(f"{T(qtype).name}: no compact repacked form next to a byte form on this CPU variant")
    x, w = _case(qtype, m, k=768 if qtype in KQUANTS else 544, seed=2)
    compact, byte = mod._rp._repack(w, form), mod._rp._repack(w, byte_form)
    assert compact[2] == 0 and byte[2] == 0
    nbytes = [u.numel() + sc.numel() * sc.element_size() for u, sc, _ in (compact, byte)]
    assert nbytes[0] < nbytes[1]   # the point of the compact form: fewer bytes read a step
    got = mod._r16(x, w, compact[0], compact[1], form=form)
    want = mod._r16(x, w, byte[0], byte[1], form=byte_form)
    assert torch.equal(got, want), f"{w.name} form {form} m={m}: max diff {(got - want).abs().max():.3g}"


def test_avx2_variant_and_portable_c_equal_the_model(monkeypatch):
    """The other compile-time paths: SLOTSERVER_CPU=avx2 (maddubs, no VNNI) and plain C (no SIMD)."""
    monkeypatch.setenv("SLOTSERVER_CPU", "avx2")
    avx2 = _load()
    if avx2._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    for qtype in QUANTIZED:
        _assert_integer_path(avx2, qtype, ms=(1, 5))
    flags = tuple(f for f in native_cache.FLAGS) + ("-march=x86-64", "-mtune=generic")
    monkeypatch.setattr(native_cache, "compile_flags", lambda: flags)
    plain = _load()
    assert plain._LIB is not None and plain._LIB._name != avx2._LIB._name
    for qtype in QUANTIZED:
        _assert_integer_path(plain, qtype, ms=(1, 5))


@pytest.mark.parametrize("m", [1, 17, 64])
def test_torch_fallback_without_native(monkeypatch, m):
    monkeypatch.setenv("SLOTSERVER_NATIVE", "0")
    fallback = _load()
    assert fallback._LIB is None
    for qtype in ALL:
        x, w = _case(qtype, m, n=21)
        err, ok = compare_outputs(fallback.cpu(x, w), fallback.reference(x, w), 1e-5)
        assert ok, f"{w.name}: {err:.3g}"


def test_weight_viewed_from_a_memmapped_gguf_file(mod, tmp_path):
    """GGUFWriter writes a Q4_K and a Q8_0 tensor; the QWeights are views of np.memmap'd bytes (no
    copy: data_ptr inside the mapping, read-only) and give the same output as from memory."""
    path = tmp_path / "w.gguf"
    weights = {"a": random_qweight(torch.Generator().manual_seed(3), T.Q4_K, 40, 512),
               "b": random_qweight(torch.Generator().manual_seed(4), T.Q8_0, 33, 96)}
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, w in weights.items():
        writer.add_tensor(name, w.raw.numpy(), raw_dtype=T(w.qtype))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    offsets = {t.name: int(t.data_offset) for t in gguf.GGUFReader(str(path)).tensors}
    mm = np.memmap(path, mode="r")
    lo, hi = mm.ctypes.data, mm.ctypes.data + mm.size
    for name, w in weights.items():
        nbytes = w.raw.numel()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # torch: "the given NumPy array is not writable"
            raw = torch.from_numpy(mm[offsets[name]:offsets[name] + nbytes].reshape(w.n, -1))
        mapped = QWeight(raw, w.qtype, w.k, w.n)
        assert lo <= raw.data_ptr() < hi and torch.equal(raw, w.raw)
        x = torch.randn(3, w.k, generator=torch.Generator().manual_seed(5))
        assert torch.equal(mod.cpu(x, mapped), mod.cpu(x, w))
        assert torch.equal(raw, w.raw)   # never written to


def test_strided_rows(mod):
    """Rows of W further apart than their bytes (a column slice of a wider buffer)."""
    x, w = _case(T.Q4_0, 3, n=11, k=256)
    wide = torch.zeros(w.n, w.raw.shape[1] + 40, dtype=torch.uint8)
    wide[:, 7:7 + w.raw.shape[1]] = w.raw
    strided = QWeight(wide[:, 7:7 + w.raw.shape[1]], w.qtype, w.k, w.n)
    assert strided.raw.stride(0) != strided.raw.shape[1]
    assert torch.equal(mod.cpu(x, strided), mod.cpu(x, w))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K])
def test_a_row_gets_the_same_floats_in_any_batch(mod, qtype):
    """Batch invariance at the kernel: a row's output does not depend on how many rows share the
    call or where it sits among them (register tiles of 2 rows, passes of 16 or 64 rows, the
    one-row path), so a request's answer never depends on its neighbours. The torch fallback's
    GEMM makes no such promise (its blocking follows the row count)."""
    if mod._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0): torch's GEMM is not batch-invariant")
    w = random_qweight(torch.Generator().manual_seed(1), qtype, 40, 512)
    x = torch.randn(130, 512, generator=torch.Generator().manual_seed(2))
    full = mod.cpu(x, w)
    for start, rows in [(0, 1), (5, 2), (63, 3), (64, 17), (100, 30), (127, 3)]:
        assert torch.equal(mod.cpu(x[start:start + rows], w), full[start:start + rows]), (start, rows)


TRITON_SCRIPT = """
import torch
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.lab.check import compare_outputs
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import T, random_qweight
mod = load_by_path(default_dir("kernels") / "qmatmul.py", KERNEL_CONTRACT).module
gen = torch.Generator().manual_seed(6)
for qtype, m, n, k in [(T.Q8_0, 3, 40, 96), (T.Q4_0, 17, 33, 64), (T.Q4_0, 1, 5, 32), (T.Q4_K, 2, 9, 256)]:
    x, w = torch.randn(m, k, generator=gen), random_qweight(gen, qtype, n, k)
    err, ok = compare_outputs(mod.triton(x, w), mod.reference(x, w), 1e-4)
    print(w.name, m, n, k, err, ok)
"""


def test_triton_q8_0_and_q4_0_interpreted():
    """The in-kernel dequantization (Q8_0, Q4_0) and the host-dequantized float mode (Q4_K), run by
    triton's interpreter (its own process: see tests/test_triton_kernels.py). Exact up to float32
    sums: the Triton path keeps x in float, no 8-bit step."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.strip()]
    assert proc.returncode == 0 and len(lines) == 4, proc.stderr[-2000:]
    for name, *_, err, ok in lines:
        assert ok == "True", f"triton {name}: max error {err}"


@pytest.mark.parametrize("m", [1, 5, 80])
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q4_K, T.Q6_K, T.Q8_0, T.Q3_K, T.F16], ids=lambda t: T(t).name)
def test_fusions_give_the_floats_of_the_separate_kernels(mod, qtype, m):
    """What the model relies on when it fuses (docs/architecture.md): the pre-norm, the SiLU gate
    and the residual add inside qmatmul give the same floats as calling rms_norm, silu_mul, qmatmul
    and an add apart: on the repacked formats (fused in C), on the others (prologue in C, then the
    usual path), at one row, a few, and prefill sizes; the second call runs on the built repack."""
    if mod._LIB is None:
        pytest.skip("no C compiler: the fusions run torch's formulas (checked against the reference by "
                    "tests/test_kernels.py), not the separate kernels' floats")
    kdir = default_dir("kernels")
    rms = load_by_path(kdir / "rms_norm.py", KERNEL_CONTRACT).module
    silu = load_by_path(kdir / "silu_mul.py", KERNEL_CONTRACT).module
    gen = torch.Generator().manual_seed(int(qtype) * 100 + m)
    k = 512
    w = random_qweight(gen, qtype, 48, k)
    x, gu = torch.randn(m, k, generator=gen), torch.randn(m, 2 * k, generator=gen)
    norm, res = 1 + 0.1 * torch.randn(k, generator=gen), torch.randn(m, 48, generator=gen)
    for _ in range(2):
        assert torch.equal(mod.cpu(x, w, norm, 1e-5), mod.cpu(rms.cpu(x, norm, 1e-5), w))
        assert torch.equal(mod.cpu(gu, w, None, 0.0, True), mod.cpu(silu.cpu(gu), w))
        acc = res.clone()
        out = mod.cpu(x, w, norm, 1e-5, False, acc)
        assert out is acc and torch.equal(acc, res + mod.cpu(rms.cpu(x, norm, 1e-5), w))
        acc = res.clone()
        mod.cpu(gu, w, None, 0.0, True, acc)
        assert torch.equal(acc, res + mod.cpu(silu.cpu(gu), w))
