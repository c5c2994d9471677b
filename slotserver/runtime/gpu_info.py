"""What the Triton kernels ask of the card they launch on: its SM count (their grids aim at a few
programs per SM) and whether triton runs interpreted on the CPU (TRITON_INTERPRET=1: CPU tensors,
the tests' mode). One copy for every kernel module (kernels/*.py import it)."""

from __future__ import annotations

import functools
import os

import torch


def interpreted() -> bool:
    """True when TRITON_INTERPRET asks triton to run kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device, default: int = 1) -> int:
    """SMs of `device`'s card, cached (a decode step asks ~100 times); `default` off a GPU."""
    if device.type != "cuda":
        return default
    return _sms_of(device.index if device.index is not None else torch.cuda.current_device())
