"""A forward's large transient buffers without page faults: glibc's malloc kept from returning them.

A prefill step allocates and frees tens of MB per matmul: its output (a 0.5B model's gate|up at 512
tokens: 512 x 9728 floats, 20 MB), the kernels' quantized activations, attention scratch. glibc
serves a block above its mmap threshold (128 KiB, raised only as far as the largest block freed
so far) with a fresh mmap() and unmaps it on free, and trims the heap's free top back to the
system: every step then page-faults again on memory it just had. `perf` of a Qwen2.5-0.5B Q4_K_M
prefill of 4 x 128 tokens (AVX-512 VNNI Zen 5, 2 threads) put ~6% of the samples in the kernel's
fault and unmap paths: 17-52 thousand minor faults a step. With the threshold at its maximum
(32 MiB: glibc refuses more) and the trim threshold at 1 GiB, the same step makes none: 368-424
-> 327-357 ms, and the RSS peak is the same (826-840 MiB either way). Setting only the trim threshold is worse
(it turns the threshold's raising off: 181 thousand faults, 550 ms).

Cost: memory a step freed stays in the process for the next (its high-water mark of transient
buffers); the weights are mapped from the file or allocated once, unaffected.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20   # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for the forward (process-wide; idempotent). -> whether it applied: False
    off Linux or without glibc's `mallopt` (musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
