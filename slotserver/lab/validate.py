"""Validate an edited kernel or layout file before it may serve. Runs inside `run_forked`.

Kernel: it loads, keeps the contract, its OP matches the file, and on fresh random inputs (from the
*serving* version's `example_inputs`) its implementation returns a tensor of the right shape and
dtype that matches the *serving* version's `reference` within tolerance. Comparing against the
serving reference (not the file's own) means an edit cannot redefine what is correct.
Layout: it loads, `create` returns an object with the whole contract, and rows written through it
come back right through `export_stream` and through the attention kernel reading its `view`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from slotserver.model.batch import Batch, SeqChunk
from slotserver.lab.kernel_set import KERNEL_CONTRACT
from slotserver.lab.kv_spec import KVSpec, StridedKV
from slotserver.lab.check import compare_outputs, move_inputs, output_tensors
from slotserver.lab.layouts import LAYOUT_CONTRACT, create_layout
from slotserver.lab.loader import ModuleLoadError, line_of, load_by_path

N_TRIALS = 3


def _fail(reason: str, line: int | str = "?") -> dict:
    return {"ok": False, "reason": reason, "line": line}


def validate_kernel(path: str, trusted_path: str, impl: str = "cpu", device: str = "cpu") -> dict:
    path_p = Path(path)
    try:
        new = load_by_path(path_p, KERNEL_CONTRACT).module
    except ModuleLoadError as e:
        return _fail(str(e), _line_from_message(str(e)))
    trusted = load_by_path(Path(trusted_path), KERNEL_CONTRACT).module
    if new.OP != trusted.OP:
        return _fail(f"OP is {new.OP!r}, expected {trusted.OP!r}")
    fn = getattr(new, impl, None)
    if not callable(fn):
        return _fail(f"missing implementation '{impl}'")
    gen = torch.Generator().manual_seed(time.time_ns() % (1 << 62))  # fresh inputs every time
    worst = 0.0
    for _ in range(N_TRIALS):
        inputs = trusted.example_inputs(gen, torch.float32)
        want = trusted.reference(*move_inputs(inputs, "cpu"))  # own copies: kv_store writes in place
        try:
            got = fn(*move_inputs(inputs, device))
        except Exception as e:  # noqa: BLE001 - the edit's failure, reported with its line
            return _fail(f"exception when called: {type(e).__name__}: {e}", line_of(e, path_p))
        if isinstance(want, torch.Tensor) and (not isinstance(got, torch.Tensor) or got.shape != want.shape
                                               or got.dtype != want.dtype):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _fail(f"wrong output: got {shape}, expected {tuple(want.shape)} {want.dtype}")
        err, _ = compare_outputs(got, want, 0.0)  # tensors, tuples, int8 StridedKV (dequantized)
        tol = trusted.TOL[torch.float32] * (1 + max(float(t.float().abs().max()) for t in output_tensors(want)))
        if not err <= tol:
            return _fail(f"wrong numerics: max error {err:.3g} > tolerance {tol:.3g} against the reference")
        worst = max(worst, err)
    return {"ok": True, "max_err": worst}


def validate_layout(path: str, attention_path: str, paged_attention_path: str | None) -> dict:
    path_p = Path(path)
    try:
        mod = load_by_path(path_p, LAYOUT_CONTRACT).module
        spec = KVSpec(n_layers=2, n_streams=4, n_cells=40, n_kv_heads=2, head_dim=16)
        layout = create_layout(load_by_path(path_p, LAYOUT_CONTRACT), spec)
    except ModuleLoadError as e:
        return _fail(str(e), _line_from_message(str(e)))
    except Exception as e:  # noqa: BLE001
        return _fail(f"create() failed: {type(e).__name__}: {e}", line_of(e, path_p))
    tol = float(getattr(mod, "TOL", 1e-5))
    try:
        return _exercise_layout(layout, spec, tol, attention_path, paged_attention_path)
    except Exception as e:  # noqa: BLE001
        return _fail(f"exception when called: {type(e).__name__}: {e}", line_of(e, path_p))


def _exercise_layout(layout, spec: KVSpec, tol: float, attn_path: str, paged_path: str | None) -> dict:
    gen = torch.Generator().manual_seed(time.time_ns() % (1 << 62))
    lens = {3: 23, 1: 17}
    dense = {s: (torch.randn(spec.n_layers, n, 2, 16, generator=gen), torch.randn(spec.n_layers, n, 2, 16, generator=gen))
             for s, n in lens.items()}
    for layer in range(spec.n_layers):
        for s, n in lens.items():
            layout.write(layer, torch.full((n,), s), torch.arange(n), dense[s][0][layer], dense[s][1][layer])
    layout.copy_stream(3, 0, lens[3])
    for s, want in ((0, dense[3]), (1, dense[1])):
        k, v = layout.export_stream(s, want[0].shape[1])
        err = max(float((k - want[0]).abs().max()), float((v - want[1]).abs().max()))
        if not err <= tol * (1 + float(want[0].abs().max())):
            return _fail(f"wrong numerics: stream {s} reads back with max error {err:.3g}")
    return _check_view(layout, spec, dense, lens, attn_path, paged_path)


def _check_view(layout, spec, dense, lens, attn_path: str, paged_path: str | None) -> dict:
    view = layout.view(1)
    path = paged_path if getattr(view, "paged", False) else attn_path
    if path is None:
        return _fail("the layout hands out a paged view but no paged_attention kernel is loaded")
    kernel = load_by_path(Path(path), KERNEL_CONTRACT).module
    meta = Batch.build([SeqChunk(s, n - 1, [0]) for s, n in lens.items()]).attn
    q = torch.randn(len(lens), 4, 16)
    got = kernel.cpu(q, view, meta, 0.25)
    k = torch.zeros(spec.n_streams, spec.n_cells, 2, 16)
    v = torch.zeros_like(k)
    for s, n in lens.items():
        k[s, :n], v[s, :n] = dense[s][0][1], dense[s][1][1]
    want = load_by_path(Path(attn_path), KERNEL_CONTRACT).module.reference(q, StridedKV(k, v), meta, 0.25)
    err = float((got.float() - want).abs().max())
    if not err <= 0.05:
        return _fail(f"wrong numerics: attention through view() differs by {err:.3g}")
    return {"ok": True, "max_err": err}


def _line_from_message(msg: str) -> int | str:
    """ModuleLoadError messages look like '/path/file.py:LINE: ...'."""
    parts = msg.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].strip().isdigit() else "?"
