"""MXFP4 (gpt-oss's expert format) as a GGUF block type: ggml's values bit for bit, and qmatmul on it.

tests/fixtures/mxfp4_ggml.npz holds what llama.cpp's libggml-base.so computes
(playground/make_mxfp4_fixture.py): dequantize_row_mxfp4 of every E8M0 exponent 0..255 with every
nibble in both halves plus random blocks, and quantize_row_mxfp4_ref of awkward float rows.
- gguf-py's dequantizer, qmatmul's C dequantizer (every CPU variant) and the embedding lookup give
  ggml's float32 bits, denormal scales (e < 2) and overflow to inf (e = 255) included; gguf-py's
  quantizer (what writes our fixtures) gives ggml's bytes;
- the C products (the per-row dots of the `qmatmul` entry and the repacked forms 8, 5 and 0) equal a
  Python model of the 8-bit activations within 1e-4 of the output scale, on this CPU's variant,
  SLOTSERVER_CPU=avx2 and plain C;
- a GGUF file with an MXFP4 matrix and a 3-D expert tensor is read in place and multiplies like
  its dequantized float32 copy; a tiny llama written in MXFP4 gives the logits of its dequantized
  weights.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tiny_gguf import write_tiny_gguf

from slotserver.lab.check import compare_outputs
from slotserver.model.gguf_file import GGUFFile
from slotserver.runtime import native_cache
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.qblocks import T, QWeight, dequantize, experts_from_mapped, from_mapped, get_rows, random_qweight

FIXTURE = np.load(Path(__file__).parent / "fixtures" / "mxfp4_ggml.npz")
MX = T.MXFP4
PATH = default_dir("kernels") / "qmatmul.py"


@pytest.fixture(scope="module", params=["native", "avx2", "plain"])
def mod(request):
    """kernels/qmatmul.py compiled for this CPU, for SLOTSERVER_CPU=avx2, and as portable C."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "avx2":
            patch.setenv("SLOTSERVER_CPU", "avx2")
        if request.param == "plain":
            flags = tuple(native_cache.FLAGS) + ("-march=x86-64", "-mtune=generic")
            patch.setattr(native_cache, "compile_flags", lambda: flags)
        m = load_by_path(PATH, KERNEL_CONTRACT).module
    if m._LIB is None:
        pytest.skip("no C compiler here (or SLOTSERVER_NATIVE=0)")
    # the portable C is its own build (avx2 is the native one on an AVX2-only host)
    assert request.param != "plain" or m._LIB._name not in _BUILT.values()
    _BUILT[request.param] = m._LIB._name
    return m


_BUILT: dict[str, str] = {}


def _fixture_weight() -> QWeight:
    blocks = torch.from_numpy(FIXTURE["blocks"].copy())   # [320, 17]: one 32-value row per block
    return QWeight(blocks, int(MX), 32, blocks.shape[0])


def _ggml_bits() -> np.ndarray:
    return FIXTURE["deq"]   # uint32 [320, 32]


def test_fixture_covers_every_exponent_and_nibble():
    blocks = FIXTURE["blocks"][:256]
    assert sorted(blocks[:, 0]) == list(range(256))
    for b in blocks:
        assert set(b[1:] & 15) == set(range(16)) and set(b[1:] >> 4) == set(range(16))
    vals = _ggml_bits().view(np.float32)
    assert vals[0, 1] > 0 and vals[0, 1] < np.finfo(np.float32).tiny   # e = 0: a denormal scale
    assert np.isinf(vals[255]).any()   # e = 255: 12 * 2^127 overflows, as in ggml


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # e = 255, as ggml
def test_gguf_dequantizer_is_ggmls_bit_for_bit():
    with np.errstate(over="ignore"):
        got = gguf.quants.dequantize(FIXTURE["blocks"], MX).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), _ggml_bits())
    assert np.array_equal(dequantize(_fixture_weight()).numpy().view(np.uint32), _ggml_bits())


def test_gguf_quantizer_is_ggmls_bit_for_bit():
    got = gguf.quants.quantize(FIXTURE["x"], MX).reshape(-1, 17)
    assert np.array_equal(got, FIXTURE["quant"])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # e = 255, as ggml
def test_c_dequantizer_and_lookup_are_ggmls_bit_for_bit(mod):
    w = _fixture_weight()
    out = torch.empty(w.n, w.k)
    mod._LIB.qdequant(w.raw.data_ptr(), out.data_ptr(), 0, w.n, w.k, w.raw.stride(0), 17, int(MX), 0, 1)
    assert np.array_equal(out.numpy().view(np.uint32), _ggml_bits())
    idx = torch.tensor([0, 1, 2, 127, 254, 255, 300])
    assert np.array_equal(get_rows(w, idx).numpy().view(np.uint32), _ggml_bits()[idx.numpy()])


def _int8_model(x: torch.Tensor, w: QWeight) -> np.ndarray:
    """The C's arithmetic in numpy: activations per 32 as d = amax / 127, q = rint(x / d), then an
    exact float64 product with the dequantized weight (the C's integer dots are exact)."""
    xf = x.float().numpy().reshape(x.shape[0], -1, 32)
    d = np.abs(xf).max(-1, keepdims=True) * np.float32(1 / 127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    xq = (np.clip(np.rint(xf * inv), -127, 127) * d.astype(np.float64)).reshape(x.shape[0], -1)
    return xq @ dequantize(w).numpy().astype(np.float64).T


def _per_row_dots(mod, x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """The `qmatmul` C entry (the unpacked per-row dots, not the repacked form)."""
    y = torch.empty(x.shape[0], w.n)
    rc = mod._LIB.qmatmul(w.raw.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], w.n, w.k, w.raw.stride(0),
                          x.stride(0), y.stride(0), 17, int(MX), 0, 0, 0, 2)
    assert rc == 0
    return y


@pytest.mark.parametrize("m", [1, 3, 9, 40])
def test_products_equal_the_int8_model(mod, m):
    gen = torch.Generator().manual_seed(m)
    x, w = torch.randn(m, 544, generator=gen), random_qweight(gen, MX, 37, 544)
    model = _int8_model(x, w)
    scale = np.abs(model).max()
    products = {"per-row": _per_row_dots(mod, x, w), "served": mod.cpu(x, w)}
    for form in (8, 5, 0):
        if mod._LIB.qmatmul_r16_serves(int(MX), form):
            u, sc, rc = mod._rp._repack(w, form)
            assert rc == 0
            products[f"form {form}"] = mod._r16(x, w, u, sc, form=form)
    for name, got in products.items():
        err = np.abs(got.double().numpy() - model).max()
        assert err <= 1e-4 * scale, f"{name} m={m}: {err:.3g}"
    assert np.abs(model - mod.reference(x, w).double().numpy()).max() > 1e-3 * scale   # the 8-bit step is real


def test_repacked_forms_keep_every_exponent(mod):
    """The nibble form 8 stores each row's E8M0 byte and decodes it in the kernel: over the
    fixture's exponents 0..240 (denormal scales included; far past, the products overflow) it gives
    form 0's floats (float32 d and m) bit for bit."""
    w = QWeight(torch.from_numpy(FIXTURE["blocks"][:241].copy()), int(MX), 32, 241)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(5))
    forms = [f for f in (8, 5, 0) if mod._LIB.qmatmul_r16_serves(int(MX), f)]
    if len(forms) < 2:
        pytest.skip("one repacked form (or none) on this CPU variant")
    outs = []
    for form in forms:
        u, sc, rc = mod._rp._repack(w, form)
        assert rc == 0
        outs.append(mod._r16(x, w, u, sc, form=form))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert torch.isfinite(outs[0]).all() and (outs[0][:, 200:] != 0).all()


def _write(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A GGUF holding each float32 array quantized to MXFP4 by gguf-py (ggml's bytes, tested above)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, a in tensors.items():
        writer.add_tensor(name, gguf.quants.quantize(a, MX), raw_dtype=MX)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_matrix_and_expert_tensor_multiply_like_their_dequantized_copies(tmp_path):
    gen = np.random.default_rng(3)
    mat, exps = gen.standard_normal((48, 256)) / 16, gen.standard_normal((4, 24, 128)) / 11
    f = GGUFFile.open(_write(tmp_path / "mx.gguf", {"w": mat.astype(np.float32), "exps": exps.astype(np.float32)}))
    qmm = load_by_path(PATH, KERNEL_CONTRACT).module
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0))
    info = f.require("w", (48, 256))
    assert info.ggml_type == MX
    w = from_mapped(f.mapped_bytes(info.offset, info.n_bytes), int(MX), (48, 256))
    dense = f.load_tensor("w")   # the dequantized float32 copy
    rel = (dense - torch.from_numpy(mat).float()).norm() / dense.norm()   # 4 bits, a power-of-two scale per 32
    assert dense.shape == (48, 256) and 0.01 < rel < 0.2
    err, ok = compare_outputs(qmm.cpu(x, w), x @ dense.T, qmm.TOL[torch.float32])
    assert ok, f"matrix: {err:.3g}"
    info = f.require("exps", (4, 24, 128))
    experts = experts_from_mapped(f.mapped_bytes(info.offset, info.n_bytes), int(MX), (4, 24, 128))
    dense = f.load_tensor("exps")   # [4, 24, 128]
    assert len(experts) == 4 and all(e.raw.data_ptr() >= 0 for e in experts)
    for e, we in enumerate(experts):
        assert (we.n, we.k) == (24, 128)
        assert torch.equal(dequantize(we), dense[e])
        err, ok = compare_outputs(qmm.cpu(x[:, :128], we), x[:, :128] @ dense[e].T, qmm.TOL[torch.float32])
        assert ok, f"expert {e}: {err:.3g}"


def test_a_tiny_mxfp4_llama_gives_the_logits_of_its_dequantized_weights(tmp_path):
    from slotserver.model.model import LlamaModel
    from slotserver.model.weights import WeightFormat

    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=MX, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128)
    assert {t.tensor_type for t in gguf.GGUFReader(path).tensors if len(t.shape) == 2} == {MX}
    logits = []
    for kind in ("dense", "q"):
        model = LlamaModel.load(path, torch.float32, max_pos=64, fmt=WeightFormat(kind))
        s = model.spec
        cache = create_layout(load_layout("seq_head_dim"), KVSpec(s.n_layers, 1, 64, s.n_kv_heads, s.head_dim, model.dtype))
        logits.append(model.forward(Batch.build([SeqChunk(0, 0, list(range(40, 58)), all_logits=True)]), cache))
    a, b = logits   # the 8-bit activations' error, as Q8_0 and Q4_0 files show it here (1.7-1.9%)
    assert (a - b).norm() < 0.03 * a.norm()
    assert (a.softmax(-1) - b.softmax(-1)).abs().max() < 0.03
