"""GGUF blocks dequantized by torch ops, on whatever device the bytes are: the GPU load path.

Why: `--device cuda` with dense weights dequantizes every matmul weight once at load. gguf-py's
numpy dequantizers run on one CPU thread at ~120 M values/s (threads do not help: measured equal on
a Q4_K tensor), so an 8B Q4_K file took over a minute before the first token. Here the raw bytes
move to the device first (a third of the dense bytes), and the same arithmetic runs there.

Bit-exact with gguf-py: each format is gguf's `dequantize_blocks` written with the same float32
operations in the same order (every product and difference is a separate torch op, so no fused
multiply-add changes a rounding); tests/test_torch_dequant.py compares every format bit for bit.
Formats without a port here return None, and the caller uses gguf's numpy path.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as T

QK_K = 256
_MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)   # e2m1, doubled (gguf-py)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 little-endian halves -> [n, 1] float32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """[n, groups * width] bytes -> [n, groups, 2, width]: low nibbles, then high ones, per group."""
    qs = qs.reshape(qs.shape[0], groups, 1, width)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2)


def _bits(x: torch.Tensor, n: int) -> torch.Tensor:
    """[blocks, 4] uint8 (a little-endian uint32) -> [blocks, n] its low n bits, bit i in column i."""
    word = x.to(torch.int64)
    word = word[:, 0] | (word[:, 1] << 8) | (word[:, 2] << 16) | (word[:, 3] << 24)
    return ((word[:, None] >> torch.arange(n, device=x.device)) & 1).to(torch.uint8)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 1, 16).reshape(b.shape[0], 32).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 1, 16).reshape(b.shape[0], 32).float()
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5(b: torch.Tensor, off: int) -> torch.Tensor:
    """Q5_0 / Q5_1's 5-bit values (qh bits at b[off:off+4], nibbles after)."""
    ql = _nibbles(b[:, off + 4:], 1, 16).reshape(b.shape[0], 32)
    return ql | (_bits(b[:, off:off + 4], 32) << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * (_q5(b, 2).to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _q5(b, 4).float() + _f16(b[:, 2:4])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 scale bytes -> (scales, mins), each [n, 8] uint8 (gguf's get_scale_min)."""
    s = s.reshape(s.shape[0], 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: (d * sc, dmin * m), each [n, 8, 1] float32."""
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(-1, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(-1, 8, 1)
    return d, dm


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dm = _k_scales(b)
    q = _nibbles(b[:, 16:], 4, 32).reshape(-1, 8, 32).float()
    return (d * q - dm).reshape(-1, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    d, dm = _k_scales(b)
    ql = _nibbles(b[:, 48:], 4, 32).reshape(-1, 8, 32)
    qh = b[:, 16:48].reshape(-1, 1, 32) >> torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
    q = (ql | ((qh & 1) << 4)).float()
    return (d * q - dm).reshape(-1, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b[:, 208:210]) * scales).reshape(n, QK_K // 16, 1)
    lo = _nibbles(ql, 2, 64).reshape(n, -1, 32)
    sh = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
    hi = ((qh.reshape(n, -1, 1, 32) >> sh) & 3).reshape(n, -1, 32)
    q = ((lo | (hi << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    return (d * q).reshape(n, QK_K)


def _mxfp4(b: torch.Tensor) -> torch.Tensor:
    e = b[:, :1].to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    d = bits.view(torch.float32)
    q = _nibbles(b[:, 1:], 1, 16).reshape(b.shape[0], 32).long()
    values = torch.tensor(_MXFP4_VALUES, dtype=torch.float32, device=b.device)
    return d * values[q]


_PORTS = {T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
          T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k, T.MXFP4: _mxfp4}
_BLOCK_BYTES = {T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q8_0: (32, 34),
                T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210), T.MXFP4: (32, 17)}
ROWS_PER_CALL = 1 << 18   # blocks per call: bounds the float32 temporaries (~256 MB each at Q4_K)


def ported(qtype: int) -> bool:
    return T(qtype) in _PORTS


def dequantize(rows: torch.Tensor, qtype: int, k: int) -> torch.Tensor | None:
    """rows [n, row_bytes] uint8 (any device) of `qtype` blocks along k -> float32 [n, k] on the
    same device, equal bit for bit to gguf-py's dequantization; None for a format not ported."""
    qtype = T(qtype)
    if qtype not in _PORTS:
        return None
    block, size = _BLOCK_BYTES[qtype]
    n = rows.shape[0]
    blocks = rows.reshape(-1, size)                              # [n * k / block, size]
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32, device=rows.device)
    for b0 in range(0, blocks.shape[0], ROWS_PER_CALL):
        out[b0:b0 + ROWS_PER_CALL] = _PORTS[qtype](blocks[b0:b0 + ROWS_PER_CALL])
    return out.reshape(n, k)
