"""The one validator of kernels and layouts: the lab's reload and `slotserver lab check` both use it.

Kernel (`validate_kernel`): the file's bytes load, keep the contract (`contract_problem`), and on
fresh random inputs from the *serving* version's `example_inputs` the implementation returns
outputs of the right shape and dtype that match the *serving* version's `reference` within its
`TOL` (`compare_outputs`: absolute + relative, like `torch.testing.assert_close`). Comparing with
the serving reference means an edit cannot redefine what is correct; `lab check` passes a module
as its own trusted version.
Layout (`validate_layout`): the bytes load, `create` returns an object with the whole contract, and
rows written through it come back right through `export_stream`, through a stream copy, and
through the attention kernel reading its `view`. One spec and one tolerance for both callers.

Why bytes (`Source`) and module objects, not paths: the reload reads the file once, validates
those bytes in a forked child (the serving modules are inherited by the fork, not re-imported),
and swaps in a module executed from the same bytes, so what serves is what was validated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from slotserver.lab.compare import compare_outputs, move_inputs
from slotserver.runtime.kernel_set import load_kernel
from slotserver.runtime.kv_spec import KVSpec, StridedKV
from slotserver.runtime.layouts import LAYOUT_CONTRACT, create_layout
from slotserver.runtime.loader import ModuleLoadError, Source, line_of, load_source
from slotserver.runtime.batch import Batch, SeqChunk

N_TRIALS = 3
LAYOUT_SPEC = KVSpec(n_layers=2, n_streams=4, n_cells=40, n_kv_heads=2, head_dim=16)
LAYOUT_TOL = 1e-5        # read-back tolerance unless the layout says otherwise (`TOL`, e.g. q8's int8 rows)


@dataclass
class Numerics:
    """One implementation against the trusted reference over `n_cases` inputs of one dtype."""
    max_err: float = 0.0
    tol: float = 0.0
    ok: bool = True
    reason: str = ""
    line: int | str = "?"


def fail(reason: str, line: int | str = "?") -> dict:
    return {"ok": False, "reason": reason, "line": line}


def kernel_numerics(fn, trusted, dtype: torch.dtype, gen: torch.Generator, n_cases: int,
                    device: str = "cpu", path=None) -> Numerics:
    """`fn` (an implementation) against `trusted.reference` on `trusted.example_inputs`."""
    res = Numerics(tol=float(trusted.TOL[dtype]))
    for _ in range(n_cases):
        inputs = trusted.example_inputs(gen, dtype)
        want = trusted.reference(*move_inputs(inputs, "cpu"))  # own copies: an op may write in place
        try:
            got = fn(*move_inputs(inputs, device))
        except Exception as e:  # noqa: BLE001 - the edit's failure, reported with its line
            return Numerics(res.max_err, res.tol, False, f"exception when called: {type(e).__name__}: {e}{in_part(e, path)}",
                            line_of(e, path) if path else "?")
        if isinstance(want, torch.Tensor) and (not isinstance(got, torch.Tensor) or got.shape != want.shape
                                               or got.dtype != want.dtype):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return Numerics(res.max_err, res.tol, False, f"wrong output: got {shape}, expected {tuple(want.shape)} {want.dtype}")
        err, ok = compare_outputs(got, want, res.tol)
        res.max_err = max(res.max_err, err)
        if not ok:
            res.ok, res.reason = False, f"wrong numerics: max error {err:.3g} > tolerance {res.tol:.3g} against the reference"
            return res
    return res


def in_part(exc: BaseException, path) -> str:
    """' (at _part.py:LINE)' where `exc` was raised last in one of the kernel's parts (the files
    beside `path` that start with `_`: runtime/kernel_parts.py), else ''."""
    if not path:
        return ""
    folder, tb, at = Path(path).resolve().parent, exc.__traceback__, ""
    while tb is not None:
        f = Path(tb.tb_frame.f_code.co_filename)
        if f.name.startswith("_") and f.suffix == ".py" and f.resolve().parent == folder:
            at = f" (at {f.name}:{tb.tb_lineno})"
        tb = tb.tb_next
    return at


def validate_kernel(src: Source, trusted, impl: str = "cpu", device: str = "cpu") -> dict:
    """An edited kernel's bytes against the serving module `trusted` (float32, fresh inputs)."""
    try:
        new = load_kernel(src).module
    except ModuleLoadError as e:
        return fail(str(e), line_from_message(str(e)))
    if new.OP != trusted.OP:
        return fail(f"OP is {new.OP!r}, expected {trusted.OP!r}")
    gen = torch.Generator().manual_seed(time.time_ns() % (1 << 62))  # fresh inputs every time
    res = kernel_numerics(getattr(new, impl), trusted, torch.float32, gen, N_TRIALS, device, src.path)
    if not res.ok:
        return fail(res.reason, res.line)
    return {"ok": True, "max_err": res.max_err}


def validate_layout(src: Source, attention, paged_attention=None, seed: int | None = None) -> dict:
    """A layout file's bytes through the contract; `attention`/`paged_attention` are kernel modules."""
    try:
        loaded = load_source(src, LAYOUT_CONTRACT)
        layout = create_layout(loaded, LAYOUT_SPEC)
    except ModuleLoadError as e:
        return fail(str(e), line_from_message(str(e)))
    except Exception as e:  # noqa: BLE001
        return fail(f"create() failed: {type(e).__name__}: {e}", line_of(e, src.path))
    seed = time.time_ns() % (1 << 62) if seed is None else seed
    try:
        tol = float(getattr(loaded.module, "TOL", LAYOUT_TOL))
        return _exercise_layout(layout, torch.Generator().manual_seed(seed), tol, attention, paged_attention)
    except Exception as e:  # noqa: BLE001
        return fail(f"exception when called: {type(e).__name__}: {e}", line_of(e, src.path))


def _exercise_layout(layout, gen: torch.Generator, tol: float, attention, paged_attention) -> dict:
    spec, lens = LAYOUT_SPEC, {3: 23, 1: 17}
    dense = {s: tuple(torch.randn(spec.n_layers, n, spec.n_kv_heads, spec.head_dim, generator=gen) for _ in "kv")
             for s, n in lens.items()}                                              # [layers, n, heads, dim]
    for layer in range(spec.n_layers):
        for s, n in lens.items():
            layout.write(layer, torch.full((n,), s), torch.arange(n), dense[s][0][layer], dense[s][1][layer])
    layout.copy_stream(3, 0, lens[3])
    worst = 0.0
    for s, want in ((0, dense[3]), (1, dense[1])):
        got = layout.export_stream(s, want[0].shape[1])
        err, _ = compare_outputs(got, want, tol)
        if not err <= tol * (1 + float(want[0].abs().max())):  # a layout's TOL is relative to the magnitude
            return fail(f"wrong numerics: stream {s} reads back with max error {err:.3g}")
        worst = max(worst, err)
    view_tol = max(float(attention.TOL[torch.float32]), 5 * tol)  # lossy rows shift attention a bit more
    return _check_view(layout, dense, lens, (attention, paged_attention), gen, worst, view_tol)


def _check_view(layout, dense, lens, kernels, gen, worst: float, tol: float) -> dict:
    attention, paged_attention = kernels
    spec, view = LAYOUT_SPEC, layout.view(1)
    kernel = paged_attention if getattr(view, "paged", False) else attention
    if kernel is None:
        return fail("the layout hands out a paged view but no paged_attention kernel is loaded")
    meta = Batch.build([SeqChunk(s, n - 1, [0]) for s, n in lens.items()]).attn
    q = torch.randn(len(lens), 2 * spec.n_kv_heads, spec.head_dim, generator=gen)
    k = torch.zeros(spec.n_streams, spec.n_cells, spec.n_kv_heads, spec.head_dim)
    v = torch.zeros_like(k)
    for s, n in lens.items():
        k[s, :n], v[s, :n] = dense[s][0][1], dense[s][1][1]
    want = attention.reference(q, StridedKV(k, v), meta, 0.25)
    err, ok = compare_outputs(kernel.cpu(q, view, meta, 0.25).float(), want, tol)
    if not ok:
        return fail(f"wrong numerics: attention through view() differs by {err:.3g}")
    return {"ok": True, "max_err": max(worst, err)}


def line_from_message(msg: str) -> int | str:
    """ModuleLoadError messages look like '/path/file.py:LINE: ...'."""
    parts = msg.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].strip().isdigit() else "?"
