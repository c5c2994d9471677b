"""The wide GEMV of kernels/qmatmul_gpu.py (QGEMV = "wide": x quantized to q8_1, 16-byte weight
loads, PTX dp4a) compiled on a CUDA card: every format it serves against a torch q8_1 quantizer and
the exact product, rows 0..2 bit-equal alone, in 3 and in 8 rows (batch invariance within the
regime: the layouts Triton picks must not change a row's float sums with M). The interpreter runs
the same cases on the CPU (tests/test_qmatmul_gpu.py); only a card runs the inline dp4a.
`playground/gpu_check.sh` runs this file with the other tests/test_gpu_*.py.
"""

from __future__ import annotations

import pytest
import torch

from test_qmatmul_gpu import _norm_q8, wide_errors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (dp4a compiled for it)")


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_wide_gemv_on_the_card_matches_the_q8_1_product_and_is_batch_invariant(x_dtype):
    for name, c in wide_errors("cuda", x_dtype).items():
        assert c["served"] and c["invariant"], (name, c)
        assert c["q8"] <= 1 and c["d"] < 1e-6, (name, c)   # a tie may round the other way (an FMA in x * 127 / max)
        # float32 out: the sums' rounding; bf16 out: the output's (2^-9) and the bf16 x's own quantization
        tol = 1e-4 if x_dtype == torch.float32 else 1e-2
        assert c["err"] < tol and c["acc_err"] < tol and c["exact_err"] < 3e-2, (name, c)


def test_the_norms_q8_1_on_the_card_is_the_quantizers():
    """rms_norm's and silu_mul's compiled `q8_1` fusion: the rows as without it, the q8_1 bit-equal to qmatmul_gpu's
    own quantizer on them (one `_quantize32`, the same contraction), torch's within a rounding step."""
    c = _norm_q8("cuda")
    assert c["same_rows"] and c["same_q8"] and c["torch_q"] <= 1 and c["torch_d"] < 1e-6, c
    assert c["gate_same_rows"] and c["gate_same_q8"], c
