"""Comparing a kernel's output with its reference: shared by the reload validator and `lab check`.

`move_inputs` gives each implementation its own copy of the inputs (an op may write into its arguments);
`compare_outputs` is `torch.testing.assert_close`'s rule (`tol` absolute + `tol` relative, NaN
fails) over tensors, tuples of tensors or an int8 `StridedKV` (compared dequantized).
"""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path

import torch


def move_inputs(x, device: str):
    """A copy of example inputs on `device`: tensors cloned (an op may write into its arguments,
    so each implementation gets its own), NamedTuples and dataclasses (AttnMeta) rebuilt."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().to(device)
    if isinstance(x, tuple):
        items = [move_inputs(e, device) for e in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: move_inputs(getattr(x, f.name), device)
                                         for f in dataclasses.fields(x) if f.init})
    return x


def compare_outputs(got, want, tol: float) -> tuple[float, bool]:
    """(max abs error, all within `tol` absolute + `tol` relative, like torch.testing.assert_close).
    Outputs are tensors or tuples of them; an int8 `StridedKV` is compared dequantized."""
    errs, ok = [0.0], True
    for g, w in zip(output_tensors(got), output_tensors(want), strict=True):
        g, w = g.detach().float().cpu(), w.detach().float().cpu()
        if g.shape != w.shape:
            return float("inf"), False
        diff = (g - w).abs()
        errs.append(float(diff.max()) if diff.numel() else 0.0)
        ok = ok and bool(torch.all(diff <= tol + tol * w.abs()))   # NaN compares False: fails
    return max(errs), ok


def output_tensors(out) -> list[torch.Tensor]:
    """A kernel's output as plain tensors: itself, a tuple's tensors, or an int8 StridedKV dequantized."""
    if isinstance(out, torch.Tensor):
        return [out]
    if getattr(out, "k_scale", None) is not None:
        return [out.k.float() * out.k_scale.unsqueeze(-1), out.v.float() * out.v_scale.unsqueeze(-1)]
    return [t for t in out if isinstance(t, torch.Tensor)]


def where_in(exc: BaseException, path: Path) -> str:
    """`file:line` of the innermost frame inside `path` (the kernel file), deepest cause first
    (the interpreter re-raises a kernel's own error from its launcher), else just the file."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    for err in reversed(chain):
        lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == Path(path)]
        if lines:
            return f"{path}:{lines[-1]}"
    return str(path)
