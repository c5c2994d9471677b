"""Every Triton kernel: numerically equal to its torch reference (run by triton's interpreter on
CPU tensors), and compiled ahead of time for sm_80 and sm_90 (PTX + cubin, no GPU needed).

Why the interpreted checks run in a subprocess: triton fixes interpret-or-compile when it is first
imported (its own `tl.sum`, `tl.max`, ... are `@jit` functions decorated then). Setting
TRITON_INTERPRET=1 later and loading a kernel file fresh gives an interpreted kernel whose calls to
`tl.sum` fail (`test_interpreting_after_a_normal_import_fails` pins the exact error). The AOT
compile needs the normal import, so it runs here, in the pytest process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.kv_spec import PagedKV, StridedKV
from slotserver.lab.check import ARCHS, check_aot, check_numerics, format_report, kernel_files, triton_mode
from slotserver.runtime.loader import default_dir, load_by_path
from slotserver.runtime.batch import Batch, SeqChunk
from triton_script import usable_cores

KERNELS = default_dir("kernels")
TRITON_FILES = [p for p in kernel_files(KERNELS) if hasattr(load_by_path(p, KERNEL_CONTRACT).module, "triton")]
DTYPES = ["float32", "bfloat16"]  # the interpreter handles bf16 (stored as uint16, computed in f32)
N_CASES = 6
MARK = "TRITON-INTERPRETED "


# Seconds each interpreted job took on the 2-core host (2026-11-27, runtime/triton_interpreter.py
# installed); unlisted jobs ~0.7. Only used to balance the jobs over the two interpreter processes.
COST = {"splits/attention": 5.3, "splits/paged_attention": 5.3, "numerics/attention": 4.5,
        "numerics/moe_matmul": 3.4, "numerics/paged_attention": 2.4, "sinks/attention": 1.9,
        "masking/attention": 1.6, "numerics/rope": 1.4, "numerics/qmatmul_gpu": 1.4, "numerics/moe_route": 1.6,
        "numerics/delta_net_step": 5.5,
        "sinks/paged_attention": 1.0, "prefill/attention": 3.4, "prefill/paged_attention": 4.1}
# interpreter processes (a thread each): one a usable core, at most 2. Under `make test` a worker is
# pinned to one core (tests/conftest.py): a second process there would only add its imports (~4 s)
PARTS = min(2, usable_cores())


def _jobs() -> list[tuple[str, str]]:
    """Every interpreted check as (kind, name): each module's numerics, and the attention checks."""
    ops = ("attention", "paged_attention")
    kinds = ("masking", "splits", "sinks", "prefill")
    return [("numerics", p.stem) for p in TRITON_FILES] + [(k, op) for k in kinds for op in ops]


def _part(jobs: list[tuple[str, str]], part: int, parts: int) -> list[tuple[str, str]]:
    """This process's share: the costliest first, each to the lightest part so far."""
    loads, mine = [0.0] * parts, []
    for job in sorted(jobs, key=lambda j: -COST.get("/".join(j), 0.7)):
        i = loads.index(min(loads))
        loads[i] += COST.get("/".join(job), 0.7)
        if i == part:
            mine.append(job)
    return mine


def _interpreted_checks(part: int = 0, parts: int = 1) -> dict:
    """Runs inside a TRITON_INTERPRET=1 process: its share of the numerics of every module and of
    the masking, split-decode and sink checks."""
    out: dict = {"numerics": {}, "masking": {}, "splits": {}, "sinks": {}, "prefill": {}}
    checks = {"masking": _masking_error, "splits": _split_decode_checks, "sinks": _sinks_checks,
              "prefill": _long_prefill_checks}
    for kind, name in _part(_jobs(), part, parts):
        if kind == "numerics":
            path = next(p for p in TRITON_FILES if p.stem == name)
            for r in check_numerics(path, "triton", N_CASES):
                out["numerics"][f"{r.kernel}/{r.dtype}"] = [r.ok, r.max_err, r.tol, r.detail]
        else:
            out[kind][name] = checks[kind](name)
    return out


@pytest.fixture(scope="module")
def interpreted() -> dict:
    if triton_mode() == "interpret":
        return _interpreted_checks()
    env = dict(os.environ, TRITON_INTERPRET="1")
    procs = [subprocess.Popen([sys.executable, __file__, str(i), str(PARTS)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(PARTS)]
    merged: dict = {}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
        assert proc.returncode == 0 and lines, stderr[-3000:]
        for kind, results in json.loads(lines[-1][len(MARK):]).items():
            merged.setdefault(kind, {}).update(results)
    return merged


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", TRITON_FILES, ids=lambda p: p.stem)
def test_triton_matches_reference_interpreted(interpreted, path, dtype):
    ok, err, tol, detail = interpreted["numerics"][f"{path.stem}/{dtype}"]
    assert ok, f"{path.stem} {dtype}: max error {err:.3g} (tol {tol}) {detail}"


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_triton_attention_never_reads_past_each_sequences_length(interpreted, op):
    """NaN in every cell past each sequence's own kv_len (and in every page it does not map): the
    decode and prefill kernels bound their loops by that length, so the output stays exact."""
    assert interpreted["masking"][op] < 1e-4


# sm_90 (the H100/H200 we are lent) in the suite; `slotserver lab check` compiles every ARCHS (sm_80
# too): both archs took ~45 s of the suite's 10 minutes on 2 cores, one ~22 s
@pytest.mark.parametrize("arch", [a for a in ARCHS if a == 90], ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("path", TRITON_FILES, ids=lambda p: p.stem)
def test_triton_kernels_compile_ahead_of_time(path, arch):
    if triton_mode() != "compile":
        pytest.skip("this process imported triton with TRITON_INTERPRET=1; `slotserver lab check` compiles")
    mod = load_by_path(path, KERNEL_CONTRACT).module
    assert mod.AOT, f"{path.stem} has a triton implementation but no AOT compile specs"
    compiled = {spec[0].__name__ for spec in mod.AOT}
    jitted = {name for name, fn in vars(mod).items() if type(fn).__name__ in ("JITFunction", "LazyJIT") and
              name.endswith("_kernel")}
    assert jitted <= compiled, f"kernels without an AOT spec: {sorted(jitted - compiled)}"
    for res in check_aot(path, (arch,)):
        assert res.ok, res.detail
        r = res.resources[f"sm_{arch}"]
        print(f"{res.kernel} [{res.dtype}] sm_{arch}: {r.regs} regs, {r.shared} B shared, "
              f"{r.spill_stores} B spill stores, {r.spill_loads} B spill loads")
        assert r.regs > 0


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_triton_decode_splits_the_context(interpreted, op):
    """Flash-decoding: with the chunk size lowered, each decode case runs several splits (empty
    ones included) and their combine, over every cache form (seq_head_dim, head_seq_dim strides, q8,
    f16 under f32/bf16 queries; shuffled tokens- or heads-first pages), with windows and softcaps;
    every cell outside each sequence's visible range holds NaN, and the output equals the reference."""
    cases = interpreted["splits"][op]
    assert len(cases) >= 8 and sum(c["splits"] > 1 for c in cases) >= 6, cases
    bad = [c for c in cases if not c["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_triton_attention_sinks_match_the_reference(interpreted, op):
    """gpt-oss's attention sinks (AttnMeta.sinks) in the decode and prefill kernels: random batches
    of every cache form forced to carry sinks, against the reference's softmax with the sink column
    (the split decode with its combine: test_triton_decode_splits_the_context's sink cases)."""
    cases = interpreted["sinks"][op]
    assert any(c["decode"] for c in cases) and any(not c["decode"] for c in cases), cases
    assert all(c["moved"] > 1e-3 for c in cases), cases   # the sinks change every case's output
    bad = [c for c in cases if not c["ok"]]
    assert not bad, bad


def _sinks_checks(op: str) -> list[dict]:
    """mod.example_inputs batches with sinks of scale 2 put on: triton vs the reference, and how
    far the sinks move the output (they must matter for the check to mean anything)."""
    mod = load_by_path(KERNELS / f"{op}.py", KERNEL_CONTRACT).module
    gen, out = torch.Generator().manual_seed(9), []
    for i in range(6):
        dtype = (torch.float32, torch.bfloat16)[i % 2]
        q, kv, meta, scale = mod.example_inputs(gen, dtype)
        plain = meta.with_layer(meta.window, meta.softcap)
        meta = meta.with_layer(meta.window, meta.softcap, 2 * torch.randn(q.shape[1], generator=gen))
        want, got = mod.reference(q, kv, meta, scale).float(), mod.triton(q, kv, meta, scale).float()
        tol = mod.TOL[dtype]
        moved = float((want - mod.reference(q, kv, plain, scale).float()).abs().max())
        out.append({"decode": meta.max_q == 1, "ok": bool(torch.all((got - want).abs() <= tol + tol * want.abs())),
                    "err": float((got - want).abs().max()), "moved": moved})
    return out


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_triton_long_prefill_chunks_match_the_reference(interpreted, op):
    """Prefill chunks longer than a 16-bit tile (the GPU's 64 x 64 tiles, so tiles every row sees
    whole run unmasked, and the row tiles run last first), bf16, over each cache form, with windows
    and softcaps, head sizes 64 and 40 (masked columns); attention.py also through TMA descriptors
    (K/V tiles past kv_len read as 0). Cells outside each sequence's visible range hold NaN."""
    cases = interpreted["prefill"][op]
    assert len(cases) >= 6 and (op != "attention" or sum(c["tma"] for c in cases) >= 3), cases
    bad = [c for c in cases if not c["ok"]]
    assert not bad, bad


# (cache kind, head_dim, window, softcap, TMA): long bf16 prefill chunks (_long_prefill_checks)
PREFILL_CASES = [(0, 64, 0, 0.0, False), (1, 64, 0, 0.0, True), (0, 64, 50, 0.0, True), (3, 64, 0, 2.0, True),
                 (1, 40, 0, 0.0, True), (0, 40, 33, 1.5, False)]


def _long_prefill_checks(op: str) -> list[dict]:
    """Each PREFILL_CASES batch (a fresh 150-token prompt and a 70-token chunk after 90 cached cells,
    on shuffled streams) through `op`'s triton with NaN outside the visible cells, against the
    reference on the clean cache. TMA applies to attention.py (16-bit caches, head_dim a power of two)."""
    mod = load_by_path(KERNELS / f"{op}.py", KERNEL_CONTRACT).module
    gen, out = torch.Generator().manual_seed(13), []
    for kind, dim, window, softcap, tma in PREFILL_CASES:
        if op == "attention":
            mod.PREFILL_TMA = tma
        kv_heads, group, n_streams, n_cells = 2, 3, 4, 168
        streams = torch.randperm(n_streams, generator=gen)[:2].tolist()
        meta = Batch.build([SeqChunk(stream=streams[0], start=0, tokens=[0] * 150),
                            SeqChunk(stream=streams[1], start=90, tokens=[0] * 70)]).attn.with_layer(window, softcap)
        q = torch.randn(220, kv_heads * group, dim, generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen) for _ in range(2))
        visible = torch.zeros(n_streams, n_cells, dtype=torch.bool)
        for s, n in zip(streams, meta.kv_lens.tolist()):
            visible[s, :n] = True
        if op == "attention":
            kv = mod._example_view(k, v, torch.bfloat16, kind)
            poisoned = _poison_view(kv, visible)
            used_tma = mod._tma_ok(q, poisoned, tma)
        else:
            kv, poisoned = _paged_case(k, v, torch.bfloat16, kind, visible, streams, meta, gen)
            used_tma = False
        want = mod.reference(q, kv, meta, 1 / math.sqrt(dim)).float()
        got = mod.triton(q, poisoned, meta, 1 / math.sqrt(dim)).float()
        tol = mod.TOL[torch.bfloat16]
        ok = bool(torch.all((got - want).abs() <= tol + tol * want.abs()))
        out.append({"case": [kind, dim, window, softcap], "tma": used_tma, "ok": ok,
                    "err": float((got - want).abs().max())})
    return out


@pytest.mark.parametrize("op", ["attention", "paged_attention"])
def test_decode_splits_fill_the_gpu(op):
    """The split heuristic (no kernel run): enough (sequence, KV head, split) programs for a few
    waves of an H100's 132 SMs, chunks of at least DECODE_MIN_CHUNK cells, one split when the
    batch fills the card by itself."""
    mod = load_by_path(KERNELS / f"{op}.py", KERNEL_CONTRACT).module
    cpu = torch.device("cpu")
    assert mod.DEFAULT_SMS == 132 and mod.DECODE_MIN_CHUNK >= 128
    assert mod.decode_splits(1, 3, 4096, cpu) == math.ceil(4096 / mod.DECODE_MIN_CHUNK)   # SmolLM2 b=1
    assert mod.decode_splits(1, 3, 100, cpu) == 1 and mod.decode_splits(8, 3, 1, cpu) == 1
    for n_seqs, kv_heads, ctx in ((8, 3, 2048), (32, 3, 2048), (64, 3, 4096), (32, 8, 8192), (64, 8, 4096)):
        n = mod.decode_splits(n_seqs, kv_heads, ctx, cpu)
        assert n_seqs * kv_heads * n >= mod.DECODE_WAVES * 132 or ctx / n < 2 * mod.DECODE_MIN_CHUNK, (n_seqs, n)
        assert ctx / n >= mod.DECODE_MIN_CHUNK
    assert mod.decode_splits(512, 8, 8192, cpu) == 1
    # constant inside a power-of-two bucket: the grid a CUDA graph captured for it replays
    assert {mod.decode_splits(1, 2, n, cpu) for n in (2049, 3000, 4096)} == {16}
    assert {mod.decode_splits(1, 3, n, cpu) for n in (513, 700, 1000, 1024)} == {4}


def test_interpreting_after_a_normal_import_fails(monkeypatch):
    """Why the interpreted checks need their own process (pins triton's behaviour)."""
    if triton_mode() != "compile":
        pytest.skip("triton was imported interpreted here")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mod = load_by_path(KERNELS / "rms_norm.py", KERNEL_CONTRACT).module
    assert type(mod._rms_norm_kernel).__name__ == "InterpretedFunction"
    with pytest.raises(Exception, match="Cannot call @triton.jit'd outside of the scope of a kernel"):
        mod.triton(torch.randn(3, 8), torch.ones(8), 1e-5)


def test_lab_check_points_at_the_broken_line(tmp_path):
    """What `slotserver lab check` tells a user whose edit breaks a kernel: a GPU-only compile
    error (a non-power-of-2 block) with its file:line, and a wrong cpu result with its error."""
    if triton_mode() != "compile":
        pytest.skip("triton was imported interpreted here")
    src = (KERNELS / "rms_norm.py").read_text()
    good = "    inv = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)                              # [ROWS]\n"
    line = src[: src.index(good)].count("\n") + 1
    c_src = (KERNELS / "rms_norm.c").read_text()
    cpu_return, c_scale = "y = torch.mul(x, weight).mul_(r)", "const float r = rms_inv(v, N, eps);"
    assert cpu_return in src and c_scale in c_src, "rms_norm.cpu changed: update the lines this test breaks"
    broken = tmp_path / "rms_norm.py"   # cpu broken both in C (the scale doubled, in its rms_norm.c) and in torch
    broken.write_text(src.replace(good, good.replace("+ eps)", "+ eps) + tl.zeros([3], tl.float32)"))
                      .replace(cpu_return, "y = x"))
    (tmp_path / "rms_norm.c").write_text(c_src.replace(c_scale, c_scale.replace("rms_inv", "2.0f * rms_inv")))
    (tmp_path / "_q8_1.py").write_text((KERNELS / "_q8_1.py").read_text())   # its part, as it is
    results = check_aot(broken, (90,)) + check_numerics(broken, "cpu", n_cases=2)
    assert not any(r.ok for r in results if r.impl == "aot" or r.dtype == "float32")
    assert f"rms_norm.py:{line}: CompilationError: Shape element 0 must be a power of 2" in results[0].detail
    report = format_report(results)
    assert "FAIL rms_norm [cpu float32]: wrong numerics: max error" in report and "checks passed" in report


def test_lab_check_points_at_the_broken_line_of_a_part(tmp_path):
    """A compile error in a kernel's part (runtime/kernel_parts.py) is reported at the part's own
    file and line, not the module's: silu_mul with its q8_1 quantizer (_q8_1.py) broken."""
    if triton_mode() != "compile":
        pytest.skip("triton was imported interpreted here")
    part = (KERNELS / "_q8_1.py").read_text()
    good = "    amax = tl.max(tl.abs(x), axis=1)\n"
    line = part[: part.index(good)].count("\n") + 1
    for name in ("silu_mul.py", "silu_mul.c"):
        (tmp_path / name).write_text((KERNELS / name).read_text())
    (tmp_path / "_q8_1.py").write_text(part.replace(good, good.replace("axis=1)", "axis=1) + tl.zeros([3], tl.float32)")))
    broken = [r for r in check_aot(tmp_path / "silu_mul.py", (90,)) if not r.ok]
    assert broken and all(f"_q8_1.py:{line}: CompilationError" in r.detail for r in broken), broken


def _masking_error(op: str) -> float:
    """Max |triton(poisoned cache) - reference(clean cache)| over a few random batches."""
    mod = load_by_path(KERNELS / f"{op}.py", KERNEL_CONTRACT).module
    gen, worst = torch.Generator().manual_seed(11), 0.0
    for _ in range(4):
        q, kv, meta, scale = mod.example_inputs(gen, torch.float32)
        want = mod.reference(q, kv, meta, scale)
        poisoned = _poison_paged(kv, meta) if kv.paged else _poison_strided(kv, meta)
        worst = max(worst, float((mod.triton(q, poisoned, meta, scale) - want).abs().max()))
    return worst


def _poison_strided(kv: StridedKV, meta) -> StridedKV:
    """Dequantized copy of the batch's cells; NaN in every other cell."""
    k, v = (t.float() * (1 if s is None else s.unsqueeze(-1)) for t, s in ((kv.k, kv.k_scale), (kv.v, kv.v_scale)))
    k2, v2 = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    for s, n in zip(meta.seq_streams.tolist(), meta.kv_lens.tolist()):
        k2[s, :n], v2[s, :n] = k[s, :n], v[s, :n]
    return StridedKV(k2, v2)


def _poison_paged(kv: PagedKV, meta) -> PagedKV:
    k2, v2 = torch.full_like(kv.k_pages, float("nan")), torch.full_like(kv.v_pages, float("nan"))
    for s, n in zip(meta.seq_streams.tolist(), meta.kv_lens.tolist()):
        cells = torch.arange(n)
        blocks, rows = kv.block_table[s, cells // kv.block_size].long(), cells % kv.block_size
        k2[blocks, rows], v2[blocks, rows] = kv.k_pages[blocks, rows], kv.v_pages[blocks, rows]
    return PagedKV(k2, v2, kv.block_table, kv.block_size)


# (q dtype, cache kind, group, head_dim, window, softcap, forced splits): kind 0 seq_head_dim,
# 1 head_seq_dim (strided view), 2 q8 (int8 + scales), 3 float16 cache; for paged_attention
# 0/1 tokens-/heads-first pages, 2 K tokens-first beside V heads-first (their strides differ), 3
# float16 pages. Group 1 takes the broadcast form, larger groups tl.dot.
SPLIT_CASES = [
    ("float32", 0, 3, 32, 0, 0.0, None),
    ("float32", 1, 3, 32, 20, 1.5, None),
    ("bfloat16", 3, 3, 32, 7, 0.0, None),
    ("bfloat16", 2, 3, 32, 0, 2.0, None),
    ("float32", 2, 1, 24, 33, 0.0, None),
    ("bfloat16", 1, 1, 32, 0, 1.0, None),
    ("float32", 3, 4, 40, 0, 0.0, 5),
    ("bfloat16", 0, 2, 16, 45, 0.0, 3),
    ("float32", 0, 3, 32, 0, 0.0, None, "sinks"),     # gpt-oss: sinks in the combine (and a window below)
    ("bfloat16", 3, 2, 32, 20, 0.0, None, "sinks"),
]


def _split_decode_checks(op: str) -> list[dict]:
    """Each SPLIT_CASES decode batch through `op`'s triton with 16-cell tiles and chunks (several
    splits for the long sequences, empty ones for the short), against the reference on the clean
    cache; every cell outside [window start, kv_len) of each sequence is NaN in what triton reads."""
    mod = load_by_path(KERNELS / f"{op}.py", KERNEL_CONTRACT).module
    mod.DECODE_BLOCK_N, mod.DECODE_MIN_CHUNK = 16, 16
    gen, out = torch.Generator().manual_seed(5), []
    for dtype_name, kind, group, dim, window, softcap, forced, *sinks in SPLIT_CASES:
        mod.DECODE_FORCE_SPLITS = forced
        dtype = getattr(torch, dtype_name)
        kv_heads, n_streams, n_cells = 2, 6, 64
        starts = [63, 0, 40, 16, 30]           # kv_len 64 (4 chunks), 1, 41, 17, 31
        streams = torch.randperm(n_streams, generator=gen)[: len(starts)].tolist()
        meta = Batch.build([SeqChunk(stream=s, start=st, tokens=[0]) for s, st in zip(streams, starts)]).attn
        meta = meta.with_layer(window, softcap, 2 * torch.randn(kv_heads * group, generator=gen) if sinks else None)
        q = torch.randn(len(starts), kv_heads * (group + 1), dim, generator=gen).to(dtype)[:, : kv_heads * group]
        k, v = (torch.randn(n_streams, n_cells, kv_heads, dim, generator=gen) for _ in range(2))
        visible = torch.zeros(n_streams, n_cells, dtype=torch.bool)
        for s, n in zip(streams, meta.kv_lens.tolist()):
            visible[s, max(0, n - window) if window else 0: n] = True
        if op == "attention":
            kv = mod._example_view(k, v, dtype, kind)
            poisoned = _poison_view(kv, visible)
        else:
            kv, poisoned = _paged_case(k, v, dtype, kind, visible, streams, meta, gen)
        want = mod.reference(q, kv, meta, 1 / math.sqrt(dim))
        got = mod.triton(q, poisoned, meta, 1 / math.sqrt(dim))
        err = float((got.float() - want.float()).abs().max())
        tol = mod.TOL[dtype]
        ok = bool(torch.all((got.float() - want.float()).abs() <= tol + tol * want.float().abs()))
        splits = mod.decode_splits(meta.n_seqs, kv_heads, min(meta.max_kv, window) if window else meta.max_kv,
                                   q.device)
        out.append({"case": [dtype_name, kind, group, dim, window, softcap, forced, *sinks], "splits": splits,
                    "ok": ok and not math.isnan(err), "err": err})
    return out


def _poison_view(kv: StridedKV, visible: torch.Tensor) -> StridedKV:
    """The same view (strides, dtype, q8 scales kept) with NaN (q8: a NaN scale) in every cell not visible."""
    if kv.k_scale is not None:
        ks, vs = (t.clone() for t in (kv.k_scale, kv.v_scale))
        ks[~visible], vs[~visible] = float("nan"), float("nan")
        return StridedKV(kv.k, kv.v, ks, vs)
    k, v = (t.clone(memory_format=torch.preserve_format) for t in (kv.k, kv.v))
    k[~visible], v[~visible] = float("nan"), float("nan")
    assert k.stride() == kv.k.stride()
    return StridedKV(k, v)


def _paged_case(k, v, dtype, kind, visible, streams, meta, gen) -> tuple[PagedKV, PagedKV]:
    """Shuffled pages of 8 cells holding k/v (kind 0 tokens-first, 1 heads-first, 2 K tokens-first
    and V heads-first: strides that differ, the decode kernel's SAME_KV off; 3 float16), an
    unmapped (-1) table tail past each sequence's cells, and the poisoned twin (NaN outside
    `visible`, the spare pages included)."""
    n_streams, n_cells, kv_heads, dim = k.shape
    bs = 8
    per_stream = n_cells // bs
    n_blocks = n_streams * per_stream + 3
    owned = torch.randperm(n_blocks, generator=gen)[: n_streams * per_stream].view(n_streams, per_stream)
    cache = torch.float16 if kind == 3 else dtype
    heads_first = (kind == 1, kind in (1, 2))   # (K, V)
    pages = [torch.randn((n_blocks, kv_heads, bs, dim) if hf else (n_blocks, bs, kv_heads, dim),
                         generator=gen).to(cache) for hf in heads_first]
    pages = [t.transpose(1, 2) if hf else t for t, hf in zip(pages, heads_first)]
    table = torch.full((n_streams, per_stream), -1, dtype=torch.int32)
    poisoned = [torch.full_like(t, float("nan")) for t in pages]
    for s, n in zip(streams, meta.kv_lens.tolist()):
        table[s, : -(-n // bs)] = owned[s, : -(-n // bs)].int()
        for c in range(n):
            page, r = int(owned[s, c // bs]), c % bs
            for src, dst, val in ((pages[0], poisoned[0], k), (pages[1], poisoned[1], v)):
                src[page, r] = val[s, c].to(cache)
                if visible[s, c]:
                    dst[page, r] = src[page, r]
    return PagedKV(pages[0], pages[1], table, bs), PagedKV(poisoned[0], poisoned[1], table, bs)


if __name__ == "__main__":  # the interpreted half, run by the `interpreted` fixture
    assert triton_mode() == "interpret", "run with TRITON_INTERPRET=1"
    print(MARK + json.dumps(_interpreted_checks(int(sys.argv[1]), int(sys.argv[2]))))
