"""Write tests/fixtures/mxfp4_ggml.npz: ggml's own MXFP4 dequantization and quantization, called
in llama.cpp's libggml-base.so, for tests/test_mxfp4.py to compare against bit for bit.

    python playground/make_mxfp4_fixture.py [path/to/libggml-base.so]

Inputs (deterministic, rebuilt identically by the test):
- `edge_blocks()`: every E8M0 exponent 0..255 (0 and 1 are float32 denormals in ggml's
  GGML_E8M0_TO_FP32_HALF, 255 gives 2^127 and 12 * 2^127 overflows to inf) with bytes j | (15-j) << 4,
  so each block holds every nibble in both halves; then 64 blocks of random bytes (numpy seed 0).
- `quant_inputs()`: rows of 64 floats (zeros, denormals, mixed magnitudes, ties between two
  E2M1 values, negatives, huge values) for ggml's quantize_row_mxfp4_ref.
Outputs: `deq` (ggml's dequantize_row_mxfp4, float32 bits as uint32) and `quant` (the block bytes).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

DEFAULT_LIB = Path.home() / ".cache/slotserver-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/libggml-base.so"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mxfp4_ggml.npz"


def edge_blocks() -> np.ndarray:
    """uint8 [256 + 64, 17]: every exponent with every nibble, then random blocks."""
    nib = np.arange(16, dtype=np.uint8)
    edge = np.zeros((256, 17), dtype=np.uint8)
    edge[:, 0] = np.arange(256)
    edge[:, 1:] = nib | ((15 - nib) << 4)
    rand = np.random.default_rng(0).integers(0, 256, (64, 17), dtype=np.uint8)
    return np.concatenate([edge, rand])


def quant_inputs() -> np.ndarray:
    """float32 [rows, 64] for the quantizer."""
    rng = np.random.default_rng(1)
    rows = [np.zeros(64), np.full(64, 1e-40), rng.standard_normal(64), rng.standard_normal(64) * 1e-30,
            rng.standard_normal(64) * 1e30, np.tile([0.25, -0.75, 1.25, 2.5, 5.0, -3.5, 0.125, 6.0], 8),
            rng.uniform(-1, 1, 64) * np.repeat([1e-3, 1.0, 1e3, 1e-6], 16), -np.abs(rng.standard_normal(64))]
    return np.stack(rows).astype(np.float32)


def main() -> None:
    lib = ctypes.CDLL(str(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LIB))
    lib.dequantize_row_mxfp4.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.quantize_row_mxfp4_ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    blocks = edge_blocks()
    deq = np.empty((len(blocks), 32), dtype=np.float32)
    lib.dequantize_row_mxfp4(blocks.ctypes.data, deq.ctypes.data, blocks.size // 17 * 32)
    x = quant_inputs()
    quant = np.empty((x.size // 32, 17), dtype=np.uint8)
    lib.quantize_row_mxfp4_ref(x.ctypes.data, quant.ctypes.data, x.size)
    np.savez_compressed(OUT, blocks=blocks, deq=deq.view(np.uint32), x=x, quant=quant)
    print(f"wrote {OUT}: {len(blocks)} blocks dequantized, {len(quant)} quantized")


if __name__ == "__main__":
    main()
