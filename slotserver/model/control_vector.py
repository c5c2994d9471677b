"""Control vectors (llama-server's `--control-vector`, `--control-vector-scaled`,
`--control-vector-layer-range`): a fixed direction added to the residual stream after chosen layers,
to steer what a model writes.

The files are llama.cpp's (common/common.cpp common_control_vector_load): GGUF with one F32 1-D
tensor `direction.N` per layer N >= 1, of the model's width. Every file's directions, times its
scale, are summed per layer. The sum for layer N is added to the output of layer N (0-based, after
its FFN's residual add: llama.cpp's `build_cvec`), for N from 1 to n_layers - 1 within the layer
range (default 1 to n_layers); layer 0 never has one, and a direction past the last layer is
unused, as in llama.cpp. A file with a bad tensor name, type, shape or width is refused by name
(llama.cpp logs and skips it; here a server does not start steered differently than asked).

Why here and not a layout or kernel: it is a model input, fixed at load. The add is `add_bias`
(one C call over the rows), so a CPU step graph records it and replays stay exact; the Triton
fused decode bodies (lean_step.py) have no hook for it, so a steered model on CUDA runs the layer
loop (model.py `_body`).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from slotserver.errors import ConfigError
from slotserver.model.gguf_file import GGUFError, GGUFFile


def read_directions(path: Path, scale: float) -> dict[int, np.ndarray]:
    """One file's `direction.N` tensors times `scale` -> {N: float32 [width]} (N >= 1)."""
    try:
        f = GGUFFile.open(path)
    except GGUFError as e:
        raise ConfigError(f"control vector {e}") from None
    out: dict[int, np.ndarray] = {}
    width = None
    for name, info in f.tensors.items():
        head, _, index = name.partition(".")
        layer = int(index) if head == "direction" and index.isdigit() else -1
        if layer < 1:
            raise ConfigError(f"control vector {path}: tensor {name!r} is not direction.N with a layer N >= 1")
        if info.ggml_type != gguf.GGMLQuantizationType.F32 or len(info.shape) != 1:
            raise ConfigError(f"control vector {path}: {name} must be a 1-D F32 tensor, got {info.ggml_type.name} "
                              f"{list(info.shape)}")
        if width is not None and info.shape[0] != width:
            raise ConfigError(f"control vector {path}: {name} has {info.shape[0]} values, the others {width}")
        width = info.shape[0]
        out[layer] = out.get(layer, 0) + f.load_tensor(name).numpy().astype(np.float32) * np.float32(scale)
    if not out:
        raise ConfigError(f"control vector {path}: no direction.N tensors")
    return out


def load_control(files: tuple[tuple[Path, float], ...], layers: tuple[int, int] | None, n_layers: int,
                 d_model: int, device: str = "cpu") -> dict[int, torch.Tensor] | None:
    """The summed directions of `files` ((path, scale) each) by layer, within `layers` (first, last;
    None, or a bound <= 0: 1 / n_layers) -> {layer: float32 [d_model] on `device`}; None without files."""
    if not files:
        return None
    total: dict[int, np.ndarray] = {}
    for path, scale in files:
        for layer, v in read_directions(Path(path), scale).items():
            if v.shape[0] != d_model:
                raise ConfigError(f"control vector {path}: directions of width {v.shape[0]}, the model's is {d_model}")
            total[layer] = total.get(layer, 0) + v
    first, last = layers or (1, n_layers)
    first, last = first if first > 0 else 1, last if last > 0 else n_layers   # llama.cpp: <= 0 is the default
    return {n: torch.from_numpy(np.ascontiguousarray(v)).to(device) for n, v in sorted(total.items())
            if 1 <= n < n_layers and first <= n <= last}
