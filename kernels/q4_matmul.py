"""q4_matmul: `y = x @ W^T` for 4-bit weights (groups of 32 along `in`, w = d * q + m, q in 0..15:
Q4_1 re-encoded exactly) in the AMX kernel's packed layout; the `--weights int4|auto4` path.

Why AMX tiles: torch's `_weight_int4pack_mm_for_cpu` works on blocks of 4 rows and unpacks the
whole weight again for each block, in float32 FMAs: 8 rows cost 2.5x one row, 16 rows 4.7x. Here,
per block of 16 output columns and group of 32 inputs, the 4-bit weights become one bf16 AMX B tile
and one `tdpbf16ps` serves up to 16 rows, so the cost is nearly flat in rows (30 layers' matmuls of
SmolLM2: 6.1 ms at 1 row, 6.9 at 8, 8.1 at 16; torch 5.2 / 13.3 / 24.8; docs/performance.md).
The default `--weights auto` computes on the GGUF blocks themselves instead (kernels/qmatmul.py);
this op stays for AMX hosts, where it was measured fastest at 3-32 rows of Q4_1.

Layout (`pack`, fixed at load: a reload of this file must keep it):
- `w4`: `[out/16, in/32, 16, 16]` bytes: column block, group, k pair p, column i -> the byte
  `q[i][2p] | q[i][2p+1] << 4`. Widened to 32-bit lanes, masked and OR-ed with 0x4300 per half,
  a byte becomes the bf16 pair (128 + q[i][2p], 128 + q[i][2p+1]): exactly row p of the B tile
  (AMX's pair-interleaved layout), no table, no conversion.
- `dz`: `[out/16, in/32, 2, 16]` float32: d, and z = m - 128 d, so that per group
  y += d * sum_k x_k (128 + q_k) + z * sum_k x_k.
`cpu`: the AMX C kernel (bf16 activations and output, float32 sums) where the CPU variant is `amx`
(`slotserver.runtime.cpu_features`), the compiler has AMX-BF16 and the OS grants tile data; elsewhere
(and for the AMX-less variants) the reference. The C compiles everywhere: the AMX code sits under
`#if defined(__AMX_TILE__) && ...` and the entry point returns -1 without it.
TOL: x and the output rounded to bf16 (2^-9 relative each) on outputs of RMS ~1: 2e-2.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import triton as _triton
import triton.language as tl

from slotserver.runtime import cpu_features
from slotserver.runtime import native

OP = "q4_matmul"
TOL = {torch.float32: 2e-2, torch.bfloat16: 2e-2}
GROUP = 32

# The AMX kernel in C (kernels/q4_matmul.c).
NATIVE_C = native.c_source(__file__, "q4_matmul.c")
_LIB = native.build("q4_matmul", NATIVE_C, origin=native.c_path(__file__, "q4_matmul.c"))
native.signature(_LIB, "q4_matmul", 4, 3, (ctypes.c_int,))


def unpack(w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """The packed weight as float32 `[out, in]` (w = d * q + m)."""
    nb, g = w4.shape[:2]
    q = torch.stack([w4 & 15, w4 >> 4], dim=-1)                          # [nb, g, p, i, j]
    q = q.permute(0, 3, 1, 2, 4).reshape(nb * 16, g * GROUP).float()      # [out, in]
    d, z = (dz[:, :, c].permute(0, 2, 1).reshape(nb * 16, g) for c in (0, 1))  # [out, groups]
    m = z + 128 * d
    return (q.view(nb * 16, g, GROUP) * d[..., None] + m[..., None]).view(nb * 16, g * GROUP)


def reference(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """Dequantize, then a float32 matmul: x [rows, in] -> [rows, out] in x's dtype."""
    return (x.float() @ unpack(w4.cpu(), dz.cpu()).to(x.device).T).to(x.dtype)


@functools.cache
def available() -> bool:
    """The CPU variant allows AMX, the library was built with it, and the OS lets this process use
    the tiles (one trial call)."""
    if _LIB is None or not cpu_features.current().amx:
        return False
    x, out = torch.zeros(1, GROUP, dtype=torch.bfloat16), torch.empty(1, 16, dtype=torch.bfloat16)
    w4, dz = torch.zeros(1, 1, 16, 16, dtype=torch.uint8), torch.zeros(1, 1, 2, 16)
    return _LIB.q4_matmul(x.data_ptr(), w4.data_ptr(), dz.data_ptr(), out.data_ptr(), 1, 16, GROUP, 1) == 0


def pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [out, in] ints 0..15; d, m: [out, in/32] -> (w4, dz) in the layout above."""
    n, k = q.shape
    assert k % GROUP == 0 and n % 16 == 0, f"q4_matmul needs in % 32 == 0 and out % 16 == 0, got {tuple(q.shape)}"
    g = k // GROUP
    pairs = q.to(torch.uint8).view(n // 16, 16, g, 16, 2)                       # [nb, i, g, p, j]
    w4 = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 3, 1).contiguous()  # [nb, g, p, i]
    d16, m16 = (t.float().view(n // 16, 16, g).permute(0, 2, 1) for t in (d, m))  # [nb, g, i]
    dz = torch.stack([d16, m16 - 128 * d16], dim=2).contiguous()                 # [nb, g, 2, i]
    return w4, dz


def cpu_path() -> str:
    """What `cpu` computes with here (shown in /props, /lab and `slotserver top`)."""
    return "AMX bf16 tiles" if available() else "torch reference (no AMX in this CPU variant)"


def cpu(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """x: [rows, in] -> [rows, out] in x's dtype: the AMX kernel where it runs, else the reference."""
    if not available():
        return reference(x, w4, dz)
    xb = x.to(torch.bfloat16).contiguous()
    rows, k = xb.shape
    nb, g = w4.shape[:2]
    if not (w4.dtype == torch.uint8 and w4.shape == (nb, g, 16, 16) and w4.is_contiguous() and k == g * GROUP
            and dz.dtype == torch.float32 and dz.shape == (nb, g, 2, 16) and dz.is_contiguous()):
        raise ValueError(f"q4_matmul: x {tuple(x.shape)} does not fit w4 {tuple(w4.shape)} / dz {tuple(dz.shape)}")
    out = torch.empty((rows, nb * 16), dtype=torch.bfloat16)
    rc = _LIB.q4_matmul(xb.data_ptr(), w4.data_ptr(), dz.data_ptr(), out.data_ptr(), rows, nb * 16, k,
                        torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"q4_matmul (C) failed with {rc}")
    return out.to(x.dtype)


@_triton.jit
def _q4_matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of y = x @ w^T, float32 accumulation."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + j
        xt = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_x + k[None, :],
                     mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BM, BK]
        wt = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + k[None, :],
                     mask=(offs_n[:, None] < N) & (k[None, :] < K), other=0.0).to(tl.float32)   # [BN, BK]
        acc += tl.dot(xt, tl.trans(wt))
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


TRITON_BLOCK_M, TRITON_BLOCK_N, TRITON_BLOCK_K = 16, 32, 32


def triton(x: torch.Tensor, w4: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """On a GPU (or the interpreter): the groups unpacked to a dense float weight on x's device
    (this packing is AMX's tile order; a GPU has no use for it), then a Triton matmul."""
    w = unpack(w4.to(x.device), dz.to(x.device)).float().contiguous()          # [out, in]
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0] and w.shape[0]:
        grid = (_triton.cdiv(x.shape[0], TRITON_BLOCK_M), _triton.cdiv(w.shape[0], TRITON_BLOCK_N))
        _q4_matmul_kernel[grid](x, w, y, x.shape[0], w.shape[0], w.shape[1], x.stride(0), w.stride(0), y.stride(0),
                                BLOCK_M=TRITON_BLOCK_M, BLOCK_N=TRITON_BLOCK_N, BLOCK_K=TRITON_BLOCK_K)
    return y


def _aot(x: str) -> tuple:
    sig = {"x_ptr": f"*{x}", "w_ptr": "*fp32", "y_ptr": f"*{x}", "M": "i32", "N": "i32", "K": "i32",
           "stride_x": "i32", "stride_w": "i32", "stride_y": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    return (_q4_matmul_kernel, sig, {"BLOCK_M": TRITON_BLOCK_M, "BLOCK_N": TRITON_BLOCK_N, "BLOCK_K": TRITON_BLOCK_K})


AOT = [_aot("bf16"), _aot("fp32")]


def example_inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """x [rows, in] unit-variance; a random 4-bit weight with outputs of RMS ~1, packed."""
    rows = int(torch.randint(1, 40, (), generator=gen))
    n, g = 16 * int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(1, 7, (), generator=gen))
    q = torch.randint(0, 16, (n, g * GROUP), generator=gen)
    d = (torch.rand(n, g, generator=gen) + 0.5) * (0.3 / (g * GROUP) ** 0.5)
    m = -7.5 * d * (0.5 + torch.rand(n, g, generator=gen))
    return (torch.randn(rows, g * GROUP, generator=gen).to(dtype), *pack(q, d, m))
