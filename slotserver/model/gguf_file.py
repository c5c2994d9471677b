"""Safe, memory-mapped reading of GGUF model files on top of the `gguf` package.

`GGUFFile.open` walks the whole header with bounds-checked reads (gguf_scan.py: why not
`gguf.GGUFReader`) and keeps the tensor data mapped (`mapped_bytes`), dequantized when a tensor is
loaded. Every failure is a `GGUFError` whose text is one line, "<path>: <problem>", fit to show a
user instead of a traceback.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from slotserver.model.gguf_scan import Corrupt, TensorInfo, directory_problem, open_checked  # noqa: F401  (re-exports)
from slotserver.model.gguf_split import join_parts, part_count
from slotserver.errors import GGUFError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.model.tensor_check import count_nonfinite, describe
from slotserver.runtime import torch_dequant
from slotserver.model.tensor_table import TensorTable


class GGUFFile:
    """An opened, validated GGUF file: metadata values plus lazily dequantized tensors.

    `metadata` holds every key/value of the file as plain Python values (as gguf's
    `field.contents()` gives them), plus GGUFReader's pseudo-keys `GGUF.version`,
    `GGUF.tensor_count` and `GGUF.kv_count`. Tensor data stays memory-mapped until loaded. A split
    GGUF is opened from its first part: its tensors are every part's (gguf_split.py).
    """

    def __init__(self, path: Path, parts: list[np.ndarray], metadata: dict[str, Any],
                 tensors: dict[str, TensorInfo]) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = TensorTable(tensors)   # records what the loaders read (tensor_table.py)
        self._parts = parts   # each file's whole bytes, read-only, over its mapping
        # Where load_tensor dequantizes the formats torch_dequant ports: a device ("cpu", "cuda"),
        # where the raw blocks go first and torch dequantizes them (runtime/torch_dequant.py: the
        # same floats bit for bit, 2.5x faster than gguf-py's one-threaded numpy on CPU, and no
        # minute of it for an 8B file); the result then lives there. None: gguf-py's numpy always.
        self.dequant_device: str | None = "cpu"

    @classmethod
    def open(cls, path: str | os.PathLike) -> GGUFFile:
        """Validate the file's structure, then read metadata; raises GGUFError on any problem."""
        path = Path(path)
        try:
            metadata, tensors, data = open_checked(path)
        except Corrupt as exc:
            raise GGUFError(path, str(exc)) from None
        if part_count(metadata) > 1:
            tensors, parts = join_parts(path, metadata, tensors, data)
            return cls(path, parts, metadata, tensors)
        return cls(path, [data], metadata, tensors)

    def require(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        """The tensor's info, after checking it exists with exactly `shape` (numpy order)."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(self.path, f"missing tensor {name}")
        if info.shape != tuple(shape):
            raise GGUFError(self.path, f"tensor {name} has shape {info.shape}, expected {tuple(shape)}")
        return info

    def load_tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantize one tensor to a new contiguous `dtype` tensor of shape `info.shape`.

        Besides the result, at most one float32 copy of this tensor is ever held (none when
        `dtype` is float32); the file's bytes are only read through the mapping.
        """
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(self.path, f"missing tensor {name}")
        block, type_size = gguf.GGML_QUANT_SIZES[info.ggml_type]
        rows = self.tensor_bytes(info).reshape(-1, info.shape[-1] // block * type_size)
        if self.dequant_device is not None and torch_dequant.ported(info.ggml_type):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)   # the mapping is read-only; nothing writes it
                raw = torch.from_numpy(rows).to(self.dequant_device)   # [rows, row_bytes] uint8 (CPU: a view)
            return torch_dequant.dequantize(raw, info.ggml_type, info.shape[-1]).reshape(info.shape).to(dtype)
        try:
            values = gguf.quants.dequantize(rows, info.ggml_type)
        except NotImplementedError:
            raise GGUFError(self.path, f"tensor {name} has unsupported type {info.ggml_type.name}") from None
        values = np.asarray(values, dtype=np.float32).reshape(info.shape)
        if not values.flags.writeable or not values.flags.c_contiguous:
            values = np.array(values, dtype=np.float32, order="C")  # F32 is a view of the mmap
        return torch.from_numpy(values).to(dtype)

    def check_tensors(self) -> None:
        """`--check-tensors`: raise GGUFError naming the first tensor whose data holds NaN or inf
        where llama.cpp's check looks (tensor_check.py), so the file is refused at load rather
        than failing every request with NaN logits."""
        bad = [(info, count) for info in self.tensors.values()
               if (count := count_nonfinite(self.tensor_bytes(info), info.ggml_type)).first >= 0]
        if bad:
            (info, count), more = bad[0], len(bad) - 1
            also = f" (and {more} more tensor{'s' if more > 1 else ''})" if more else ""
            raise GGUFError(self.path, f"{describe(info.name, info.ggml_type, count)}{also}; refused by --check-tensors")

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """A tensor's data as a read-only uint8 view of its file's mapping (no copy: a quantized
        weight is computed on in place)."""
        return self.mapped_bytes(info.offset, info.n_bytes, info.part)

    def joined_bytes(self, infos: list[TensorInfo]) -> np.ndarray | None:
        """Several tensors' data as one view where they lie back to back in one file, else None."""
        if not all(a.part == b.part and a.offset + a.n_bytes == b.offset for a, b in zip(infos, infos[1:])):
            return None
        return self.mapped_bytes(infos[0].offset, sum(i.n_bytes for i in infos), infos[0].part)

    def mapped_bytes(self, offset: int, n_bytes: int, part: int = 0) -> np.ndarray:
        """Bytes [offset, offset + n_bytes) of file `part` (0: the first or only one) as a read-only
        uint8 view of its mapping."""
        data = self._parts[part]
        if offset < 0 or offset + n_bytes > len(data):
            where = f"part {part + 1} of the split file" if len(self._parts) > 1 else "the file"
            raise GGUFError(self.path, f"bytes {offset}..{offset + n_bytes} lie outside {where}")
        return data[offset:offset + n_bytes]
