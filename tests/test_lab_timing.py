"""`lab check --time`'s plumbing on the CPU (tiny sizes): every kernel with bench inputs gets a
row with its bytes (inputs read + outputs written) and a time; the others say they are untimed."""

from __future__ import annotations

import torch

from slotserver.cli.lab import time_kernels
from slotserver.lab.timing import Limits, Timing, format_timings, tensor_bytes
from slotserver.runtime.kv_spec import StridedKV


def test_bytes_count_each_tensor_once_through_tuples_and_views():
    k = torch.zeros(4, 8, dtype=torch.float16)
    kv = StridedKV(k, k[:, :4])
    assert tensor_bytes((kv, [k], {"x": torch.zeros(3)})) == 64 + 32 + 12


def test_shares_are_against_the_measured_limits():
    text = format_timings([Timing("rms_norm", "8 x 8", us=1.0, bytes=1000, flops=2000),
                           Timing("qmatmul", "", detail="no bench_inputs (untimed)")], Limits(2e9, 4e9))
    row = text.splitlines()[2].split()
    assert row[-4:] == ["1", "50%", "0.00", "50%"]   # 1 GB/s of 2; 2 GFLOP/s of 4
    assert "no bench_inputs (untimed)" in text


def test_time_kernels_on_the_cpu_lists_every_kernel():
    text = time_kernels(None, small=True)
    for op in ("rms_norm", "silu_mul", "gelu_mul", "rope", "attention"):
        timed = [line for line in text.splitlines() if line.startswith(op + " ") and "%" in line]
        assert timed, f"{op} untimed:\n{text}"
    assert "untimed" in text   # kernels without bench inputs say so
