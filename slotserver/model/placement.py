"""Move a loaded model's weights to the device it computes on (`--device cuda`).

Weights load on the CPU (dequantized to the compute dtype there, one tensor at a time: see
weights.py), then each layer moves as it is: a walk over the weight dataclasses that moves every
tensor field, so a field added to `Linear` or `LayerWeights` moves without a change here. GGUF
blocks (`QWeight`) move their raw bytes (`--gpu-weights blocks`: model/gpu_weights.py).
"""

from __future__ import annotations

import dataclasses

import torch

from slotserver.model.linear import Linear
from slotserver.runtime.qblocks import QWeight


def to_device(obj, device: str):
    """`obj` with every tensor it holds (dataclass fields, lists, QWeight bytes) on `device`.
    Dataclasses are rebuilt with `replace`-like construction; tensors already there are kept."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list):
        return [to_device(o, device) for o in obj]
    if isinstance(obj, QWeight):
        return dataclasses.replace(obj, raw=obj.raw.to(device))
    if isinstance(obj, Linear) and obj.packed is not None and device != "cpu":
        # oneDNN's blocked copy is CPU-only (a bf16 load on an AVX-512 host makes it): back to [out, in]
        # (moved first: a CPU dense weight would be re-blocked by Linear.__post_init__)
        return to_device(dataclasses.replace(obj, dense=obj.packed.to_dense().to(device), packed=None), device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        moved = {f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        return type(obj)(**moved)
    return obj
