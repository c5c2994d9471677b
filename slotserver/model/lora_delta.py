"""A LoRA delta added into a matmul's output in one C call, from the matmul's own input.

`add_delta(p, x, y, scales, norm, eps, glu)`: y += ((h A^T) * s) B^T in place, where h is the
matmul's input computed from x as the fused matmul computes it (x itself; `rms_norm(x) * norm`;
or `silu(gate) * up` of x = gate|up with `glu`) and s each rank's factor times its row's adapter
scale (model/lora.py's packing). y may be the residual the fused matmul added into (x += W h):
the delta lands there too.

Why in C, and why from x rather than h: the fused qmatmul (norm, gate and residual add in one call)
never materializes h, and a step graph (step_graph.py) replays only native calls. With torch's
matmuls an adapted decode step had to run the unfused body eagerly: SmolLM2-135M Q4_1 b=1 on a
2-core AVX-512 host 6.3 ms a step without an adapter, 33 ms with a rank-16 one on every attention
and FFN matmul (an in-process A/B of model.forward), where llama-server's decode lost a fifth
(playground/lora_bench.py: x0.78). This call keeps the fused body and the graph (the same A/B:
~6.5 -> ~10 ms); it serves up to MAX_ROWS rows (decode steps), torch's matmuls the rest.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.runtime import native

MAX_ROWS = 32   # past this a step is a prefill chunk: torch's batched matmuls are faster than one row at a time

_C_FILE = Path(__file__).with_name("lora_delta.c")
NATIVE_C = _C_FILE.read_text()
_LIB = native.build("lora_delta", NATIVE_C, origin=str(_C_FILE))
native.signature(_LIB, "lora_delta", 8, 10, (native.ctypes.c_float, native.ctypes.c_int), replay=True)


def applies(x: torch.Tensor, y: torch.Tensor, norm: torch.Tensor | None) -> bool:
    """Whether the C call serves this matmul: CPU rows (few), float32 or bf16, unit last strides."""
    return (x.dim() == 2 and serves(x.shape[0], x.is_cpu) and y.dim() == 2
            and x.dtype in (torch.float32, torch.bfloat16) and y.dtype in (torch.float32, torch.bfloat16)
            and x.stride(1) == 1 and y.stride(1) == 1
            and (norm is None or (norm.dtype == torch.float32 and norm.is_contiguous())))


def add_delta(p, x: torch.Tensor, y: torch.Tensor, scales: torch.Tensor, norm: torch.Tensor | None = None,
              eps: float = 0.0, glu: bool = False) -> torch.Tensor:
    """p: model/lora.py's packed A, B, adapter, factor of one matmul; x [T, K] (glu: [T, 2K]); y [T, N];
    scales [T, adapters] float32 contiguous. -> y, updated in place (`applies` must hold)."""
    t, k = x.shape[0], x.shape[1] // 2 if glu else x.shape[1]
    mode = 2 if glu else 1 if norm is not None else 0
    rc = _LIB.lora_delta(x.data_ptr(), norm.data_ptr() if norm is not None else 0, p.a.data_ptr(), p.bt.data_ptr(),
                         p.adapter.data_ptr(), p.factor.data_ptr(), scales.data_ptr(), y.data_ptr(),
                         t, k, p.a.shape[0], p.bt.shape[1], scales.shape[1], x.stride(0), y.stride(0), mode,
                         native.is_bf16(x), native.is_bf16(y), float(eps), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError("lora_delta: out of memory")
    return y


def serves(rows: int, on_cpu: bool) -> bool:
    """Whether a step of `rows` rows adds its deltas in C (then its matmuls stay fused)."""
    return _LIB is not None and on_cpu and rows <= MAX_ROWS
