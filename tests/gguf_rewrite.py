"""Rewrite a GGUF file: its metadata with some keys set or dropped, its tensors kept, skipped or
recast, its architecture renamed, or split into parts. The tests and the fixture scripts make their
variants of a fixture with it (a Q8_0 copy, a file with one more metadata key, one without a tensor,
qwen3moe's file as qwen3vlmoe's), playground/split_gguf.py its split files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

# (name, data, the file's type) -> (data, type) to write, or None to leave it out. data: float tensors
# in their shape; quantized ones as the file's block bytes [..., bytes a row]
TensorFn = Callable[[str, np.ndarray, "gguf.GGMLQuantizationType"], "tuple[np.ndarray, gguf.GGMLQuantizationType] | None"]


def rewrite(src: Path, dst: Path, keys: dict | None = None, tensors: TensorFn | None = None,
            extra: dict[str, np.ndarray] | None = None, arch: str | None = None,
            split_max_tensors: int = 0) -> Path:
    """src to dst with `keys` (name -> (value, GGUFValueType), or None to drop the key) over its
    metadata, each tensor through `tensors` (default: as it is), and the float32 tensors `extra` added.
    arch: the architecture renamed, its `OLD.*` keys as `arch.*` (`keys` name the new ones).
    split_max_tensors: parts of at most that many tensors (dst's stem + `-00001-of-0000N.gguf`...,
    as the converters write them). -> the path written (a split file's first part)."""
    keys = keys or {}
    reader = gguf.GGUFReader(src)
    old = reader.fields["general.architecture"].contents()
    arch = arch or old
    w = gguf.GGUFWriter(Path(dst), arch, split_max_tensors=split_max_tensors)
    for name, field in reader.fields.items():
        name = arch + name[len(old):] if name.startswith(old + ".") else name
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), field.types[0])
    for name, entry in keys.items():
        if entry is not None:
            w.add_key_value(name, *entry)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = data.reshape([int(n) for n in reversed(t.shape.tolist())])
        out = (data, t.tensor_type) if tensors is None else tensors(t.name, data, t.tensor_type)
        if out is not None:
            w.add_tensor(t.name, out[0], raw_dtype=out[1])
    for name, data in (extra or {}).items():
        w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(Path(dst))[0]
