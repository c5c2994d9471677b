"""A GGUF split into parts, served from its first part as llama.cpp loads it (llama-model-loader.cpp).

`llama-gguf-split --split` and the converters' `--split-max-tensors/--split-max-size` write
`NAME-00001-of-00003.gguf`, `NAME-00002-of-00003.gguf`, ...: the first part holds every metadata key
plus `split.no` 0, `split.count` N and `split.tensors.count`; every other part holds its own
`split.*` keys and its tensors. Hub repositories split large files (and some, Qwen's 7B GGUFs,
files of a few GB), so `-m NAME-00001-of-00003.gguf`, or `-hf` of such a model, serves them as one
model. The metadata is the first part's alone, as in llama.cpp.

The other parts' names come from the first's (llama.cpp's llama_split_prefix/llama_split_path);
each is scanned with the same bounds checks (gguf_scan.py) and mapped, and each tensor knows its
part (`TensorInfo.part`). Refused, in one line naming the file: a later part given first, a part
missing or corrupt, a part whose `split.no` is not its place, a tensor in two parts, and a tensor
count other than `split.tensors.count`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from slotserver.errors import GGUFError
from slotserver.hub.cache import part_name
from slotserver.model.gguf_scan import Corrupt, TensorInfo, open_checked

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def part_count(metadata: dict[str, Any]) -> int:
    """How many parts the file says the model has (1: not split)."""
    return max(1, int(metadata.get(SPLIT_COUNT) or 1))


def part_paths(path: Path, index: int, count: int) -> list[Path]:
    """Every part's path, from part `index` (0-based) of `count`: `-0000i-of-0000N.gguf` names."""
    suffix = part_name("", index + 1, count)
    if not path.name.endswith(suffix) or len(path.name) == len(suffix):
        raise GGUFError(path, f"is part {index + 1} of {count} of a split GGUF (split.no {index}), "
                              f"but its name does not end in {suffix}, so the other parts cannot be found")
    prefix = path.name[:-len(suffix)]
    return [path.with_name(part_name(prefix, i + 1, count)) for i in range(count)]


def join_parts(path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo],
               data: np.ndarray) -> tuple[dict[str, TensorInfo], list[np.ndarray]]:
    """The first part's scan plus every other part's -> (all tensors, each part's mapped bytes)."""
    count = part_count(metadata)
    if SPLIT_NO not in metadata:
        raise GGUFError(path, f"split.count is {count} but split.no is missing")
    index = int(metadata[SPLIT_NO])
    paths = part_paths(path, index, count)
    if index != 0:
        raise GGUFError(path, f"is part {index + 1} of {count} of a split GGUF: give the first part, "
                              f"{paths[0].name}")
    joined, maps = dict(tensors), [data]
    for i, part in enumerate(paths[1:], start=1):
        meta_i, tensors_i, data_i = _open_part(part, i, count, path)
        if meta_i.get(SPLIT_NO) != i:
            raise GGUFError(part, f"split.no is {meta_i.get(SPLIT_NO)}, expected {i} (part {i + 1} of {count} "
                                  f"of {path.name})")
        for name, info in tensors_i.items():
            if name in joined:
                raise GGUFError(part, f"tensor {name} is also in part {joined[name].part + 1} of {path.name}")
            joined[name] = replace(info, part=i)
        maps.append(data_i)
    expected = metadata.get(SPLIT_TENSORS)
    if expected is not None and int(expected) != len(joined):
        raise GGUFError(path, f"split.tensors.count is {expected} but the {count} parts hold {len(joined)} tensors")
    return joined, maps


def _open_part(part: Path, i: int, count: int, first: Path):
    try:
        return open_checked(part)
    except Corrupt as exc:
        raise GGUFError(part, f"part {i + 1} of {count} of {first.name}: {exc}") from None
