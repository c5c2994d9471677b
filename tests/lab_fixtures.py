"""What the lab tests share: a copy of the bundled lab folders, and an rms_norm variant to save."""

from __future__ import annotations

import shutil
from pathlib import Path

from slotserver.runtime.loader import default_dir

RMS_NORM_VARIANT = '''"""rms_norm, an equivalent variant: normalise with x * rsqrt(mean(x^2)+eps) written out by hand."""
import torch
OP = "rms_norm"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
def reference(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
def cpu(x, weight, eps):
    xf = x.float()
    inv = (xf * xf).sum(-1, keepdim=True).div_(x.shape[-1]).add_(eps).rsqrt_()
    return (xf * inv * weight.float()).to(x.dtype)
def example_inputs(gen, dtype):
    x = torch.randn(7, 33, generator=gen).to(dtype)
    return x, (1 + 0.1 * torch.randn(33, generator=gen)).to(dtype), 1e-5
triton = cpu  # a CPU-only variant: the contract needs the name, CPU serving never calls it
'''


def lab_dirs(tmp_path: Path) -> tuple[Path, Path]:
    k, lay = tmp_path / "kernels", tmp_path / "layouts"
    shutil.copytree(default_dir("kernels"), k)
    shutil.copytree(default_dir("layouts"), lay)
    return k, lay
