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


def to_device(obj, device: str, _moved: dict | None = None):
    """`obj` with every tensor it holds (dataclass fields, lists, QWeight bytes) on `device`.
    Dataclasses are rebuilt with `replace`-like construction; tensors already there are kept.
    A tensor or QWeight held twice (a tied embedding and output projection) moves once: both
    places get the same copy (`_moved`: id -> moved object, for this call)."""
    moved = {} if _moved is None else _moved
    if isinstance(obj, (torch.Tensor, QWeight)) and id(obj) in moved:
        return moved[id(obj)][1]
    if isinstance(obj, torch.Tensor):
        out = obj.to(device)
    elif isinstance(obj, list):
        return [to_device(o, device, moved) for o in obj]
    elif isinstance(obj, QWeight):
        out = dataclasses.replace(obj, raw=to_device(obj.raw, device, moved))
    elif isinstance(obj, Linear) and obj.packed is not None and device != "cpu":
        # oneDNN's blocked copy is CPU-only (a bf16 load on an AVX-512 host makes it): back to [out, in]
        # (moved first: a CPU dense weight would be re-blocked by Linear.__post_init__)
        return to_device(dataclasses.replace(obj, dense=obj.packed.to_dense().to(device), packed=None), device, moved)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: to_device(getattr(obj, f.name), device, moved) for f in dataclasses.fields(obj) if f.init}
        return type(obj)(**fields)
    else:
        return obj
    moved[id(obj)] = (obj, out)   # the source kept alive: its id is not reused during this call
    return out
