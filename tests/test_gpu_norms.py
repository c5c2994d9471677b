"""kernels/rms_norm.py compiled on a CUDA card with several rows a program (`rows_a_program`: 4 rows
of 896 columns, 16 of a per-head norm's 128): every row's output equals the reference, and is
bit-equal whether it is normed alone or among 5 or 33 rows (the program's row count is fixed by the
width, so Triton's reduction layout, and a row's float sums, do not change with the batch).
`playground/gpu_check.sh` runs this file with the other tests/test_gpu_*.py.
"""

from __future__ import annotations

import pytest
import torch

from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import default_dir, load_by_path

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("cols", [896, 128, 4096])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "add"])
def test_narrow_rows_on_the_card_match_the_reference_and_the_batch(cols, fused):
    mod = load_by_path(default_dir("kernels") / "rms_norm.py", KERNEL_CONTRACT).module
    gen = torch.Generator(device="cuda").manual_seed(cols)
    x0 = torch.randn(33, cols, generator=gen, device="cuda")
    y = torch.randn(33, cols, generator=gen, device="cuda").to(torch.bfloat16)
    w = 1 + 0.1 * torch.randn(cols, generator=gen, device="cuda")

    def norm(rows: int) -> torch.Tensor:
        if fused:   # the lean body's form: x += y (float32 residual), normed into bf16
            return mod.triton(x0[:rows].clone(), w, 1e-6, add=y[:rows], out_dtype=torch.bfloat16)
        return mod.triton(x0[:rows].to(torch.bfloat16), w, 1e-6)

    outs = {rows: norm(rows) for rows in (1, 5, 33)}
    want = mod.reference(x0.clone() if fused else x0.to(torch.bfloat16), w, 1e-6, add=y if fused else None,
                         out_dtype=torch.bfloat16)
    assert torch.allclose(outs[33].float(), want.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(outs[1], outs[33][:1]) and torch.equal(outs[5], outs[33][:5])
