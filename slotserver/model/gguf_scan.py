"""The bounds-checked walk of a GGUF file's header: metadata and tensor directory (gguf_file.py).

`gguf.GGUFReader` trusts the file: a huge array length makes it loop once per element (growing
lists of numpy views) until the file runs out, minutes and gigabytes on a 100 MB model; short
reads give empty arrays that fail later with IndexError; overlapping or misaligned tensor data
passes unnoticed. So this walks the whole header itself with bounds-checked `struct` reads
(`_scan_layout`: no loop longer than the file could hold, every count checked against the bytes
left before it is used) and decodes the metadata in the same walk: numeric arrays straight from the
mapping with numpy, strings one by one. Why not GGUFReader at all: it builds a numpy view per
array element, 0.6-1.5 s for a 49k-token vocabulary and several seconds for a 262k one, most of a
small model's time to healthy; this walk reads the same metadata in a fraction of that. Every
problem is a `Corrupt` whose text is one line; `GGUFFile.open` makes it "<path>: <problem>".
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata (kv) count
SUPPORTED_VERSIONS = (2, 3)  # what GGUFReader reads (v1 used 32-bit counts)
MAX_DIMS = 4  # GGML_MAX_DIMS
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest (1-byte) value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset

_VT = gguf.GGUFValueType
_SCALAR_DTYPES = {_VT.UINT8: "<u1", _VT.INT8: "<i1", _VT.BOOL: "<u1", _VT.UINT16: "<u2", _VT.INT16: "<i2",
                  _VT.UINT32: "<u4", _VT.INT32: "<i4", _VT.FLOAT32: "<f4", _VT.UINT64: "<u8", _VT.INT64: "<i8",
                  _VT.FLOAT64: "<f8"}
_SCALAR_SIZES = {t: np.dtype(d).itemsize for t, d in _SCALAR_DTYPES.items()}


class Corrupt(Exception):
    """Internal: the layout scan found a problem; `GGUFFile.open` adds the path."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch/numpy order: reverse of ggml's ne, e.g. (vocab, d_model)
    ggml_type: gguf.GGMLQuantizationType
    offset: int  # absolute byte offset of the data in the file (in its part: gguf_split.py)
    n_bytes: int
    part: int = 0  # which file of a split GGUF holds the data (0: the first, or the only one)


class _Cursor:
    """Bounds-checked little-endian reads over a byte buffer, for one header section."""

    def __init__(self, buf: mmap.mmap, pos: int, section: str) -> None:
        self.buf, self.pos, self.size, self.section = buf, pos, len(buf), section

    def need(self, n: int, what: str) -> None:
        """Refuse to need `n` more bytes than the file holds (checked before any loop)."""
        if n > self.size - self.pos:
            raise Corrupt(f"corrupt or truncated {self.section} ({what} needs {n} bytes "
                           f"at offset {self.pos}, file has {self.size})")

    def take(self, n: int, what: str) -> int:
        """Advance past `n` bytes and return where they start."""
        self.need(n, what)
        start, self.pos = self.pos, self.pos + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def text(self, what: str) -> str:
        n = self.u64(f"{what} length")
        start = self.take(n, f"{what} of length {n}")
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise Corrupt(f"corrupt {self.section} ({what} at offset {start} is not UTF-8)") from None


def _scalars(cur: _Cursor, vtype: int, count: int, what: str) -> np.ndarray:
    start = cur.take(count * _SCALAR_SIZES[vtype], what)
    return np.frombuffer(cur.buf, dtype=_SCALAR_DTYPES[vtype], count=count, offset=start)


_U64 = struct.Struct("<Q")


def _strings(cur: _Cursor, count: int, key: str) -> list[str]:
    """A string array (a vocabulary: 50k-260k items) in one tight loop: the same checks as
    `_Cursor.text`, a third of its time per item."""
    buf, pos, size, out = cur.buf, cur.pos, cur.size, []
    unpack, append = _U64.unpack_from, out.append
    try:
        for _ in range(count):
            if size - pos < 8:
                raise Corrupt(f"corrupt or truncated {cur.section} (string length in {key} needs 8 bytes "
                               f"at offset {pos}, file has {size})")
            (n,), pos = unpack(buf, pos), pos + 8
            if n > size - pos:
                raise Corrupt(f"corrupt or truncated {cur.section} (string in {key} of length {n} needs "
                               f"{n} bytes at offset {pos}, file has {size})")
            append(str(buf[pos:pos + n], "utf-8"))
            pos += n
    except UnicodeDecodeError:
        raise Corrupt(f"corrupt {cur.section} (string #{len(out)} in {key} at offset {pos} is not UTF-8)") from None
    cur.pos = pos
    return out


def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    """Decode one metadata value as plain Python (what gguf's `field.contents()` gives); arrays are
    bounded by the bytes left before looping."""
    if vtype in _SCALAR_SIZES:
        value = _scalars(cur, vtype, 1, f"value of {key}")[0].item()
        return bool(value) if vtype == _VT.BOOL else value
    if vtype == _VT.STRING:
        return cur.text(f"string value of {key}")
    if vtype != _VT.ARRAY:
        raise Corrupt(f"metadata key {key} has unknown value type {vtype}")
    item_type, count = cur.u32(f"array type of {key}"), cur.u64(f"array length of {key}")
    if item_type in _SCALAR_SIZES:
        values = _scalars(cur, item_type, count, f"{count}-item array {key}").tolist()
        return [bool(v) for v in values] if item_type == _VT.BOOL else values
    if item_type == _VT.STRING:
        cur.need(count * 8, f"{count}-string array {key}")  # each string has an 8-byte length
        return _strings(cur, count, key)
    raise Corrupt(f"metadata key {key} has unsupported array item type {item_type}")


def _scan_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], int]:
    """Walk and decode the key/value section -> (metadata, data alignment: general.alignment or 32)."""
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.text(f"metadata key #{i}")
        if key in metadata:
            raise Corrupt(f"duplicate metadata key {key}")
        vtype = cur.u32(f"value type of {key}")
        if key == "general.alignment" and vtype != _VT.UINT32:
            raise Corrupt(f"general.alignment has value type {vtype}, expected uint32")
        metadata[key] = _read_value(cur, vtype, key)
    alignment = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        raise Corrupt(f"invalid general.alignment {alignment} (not a power of two)")
    return metadata, alignment


def _scan_tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Walk the tensor-info section: (name, shape in numpy order, type id, relative offset)."""
    infos = []
    for i in range(n_tensors):
        name = cur.text(f"tensor name #{i}")
        n_dims = cur.u32(f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise Corrupt(f"tensor {name} has {n_dims} dimensions (expected 1..{MAX_DIMS})")
        ne = [cur.u64(f"dimensions of {name}") for _ in range(n_dims)]
        type_id, rel_offset = cur.u32(f"type of {name}"), cur.u64(f"offset of {name}")
        infos.append((name, tuple(reversed(ne)), type_id, rel_offset))
    return infos


def _tensor_info(raw: tuple[str, tuple[int, ...], int, int], data_start: int, alignment: int,
                 file_size: int) -> TensorInfo:
    """Check one tensor's type, row size and placement, and compute its byte size."""
    name, shape, type_id, rel_offset = raw
    try:
        qtype = gguf.GGMLQuantizationType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise Corrupt(f"tensor {name} has unknown type id {type_id}") from None
    if shape[-1] % block:
        raise Corrupt(f"tensor {name} has shape {shape} whose rows ({shape[-1]}) are not a "
                       f"multiple of the {qtype.name} block size {block}")
    n_bytes = int(np.prod(shape, dtype=object)) // block * type_size  # python ints: no overflow
    if rel_offset % alignment:
        raise Corrupt(f"tensor {name} data offset {rel_offset} is not aligned to {alignment}")
    offset = data_start + rel_offset
    if offset + n_bytes > file_size:
        raise Corrupt(f"tensor {name} data (bytes {offset}..{offset + n_bytes}) lies outside "
                       f"the file ({file_size} bytes): truncated or corrupt")
    return TensorInfo(name, shape, qtype, offset, n_bytes)


def _check_overlaps(tensors: list[TensorInfo]) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.n_bytes > b.offset:
            raise Corrupt(f"tensor {a.name} ({a.n_bytes} bytes) overlaps tensor {b.name}")


def _scan_layout(buf: mmap.mmap) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """Validate the whole file structure without trusting any count, length or offset; decode the
    metadata on the way -> (metadata, tensors)."""
    size = len(buf)
    magic, version, n_tensors, n_kv = HEADER.unpack_from(buf, 0)
    if magic != b"GGUF":
        raise Corrupt(f"not a GGUF file (magic {magic!r})")
    if version & 0xFFFF == 0 and version:
        raise Corrupt("big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise Corrupt(f"unsupported GGUF version {version} (supported: {SUPPORTED_VERSIONS})")
    room = size - HEADER.size
    if n_kv > room // MIN_KV_BYTES:
        raise Corrupt(f"impossible metadata count {n_kv} for a file of {size} bytes")
    if n_tensors > (room - n_kv * MIN_KV_BYTES) // MIN_TENSOR_INFO_BYTES:
        raise Corrupt(f"impossible tensor count {n_tensors} for a file of {size} bytes")
    cur = _Cursor(buf, HEADER.size, "metadata")
    metadata, alignment = _scan_metadata(cur, n_kv)
    metadata.update({"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv})
    cur.section = "tensor info"
    raws = _scan_tensor_infos(cur, n_tensors)
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for raw in raws:
        if raw[0] in tensors:
            raise Corrupt(f"duplicate tensor name {raw[0]}")
        tensors[raw[0]] = _tensor_info(raw, data_start, alignment, size)
    _check_overlaps(list(tensors.values()))
    return metadata, tensors


def directory_problem(path: Path) -> str:
    """What to say when -m names a folder: that it is one (not "not found", which sends the user
    looking for a missing file), and the GGUF files inside it, if any, to pick from."""
    try:
        found = sorted(p.name for p in path.glob("*.gguf") if p.is_file())
    except OSError:
        found = []
    inside = f" (it holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''})" if found else ""
    return f"is a directory{inside}: give a GGUF file, e.g. -m {path / (found[0] if found else 'model.gguf')}"


def open_checked(path: Path) -> tuple[dict[str, Any], dict[str, TensorInfo], np.ndarray]:
    """Stat the path, then scan its layout through a read-only mmap -> (metadata, tensors, the
    whole file as a read-only uint8 array over the same mapping)."""
    if not path.exists():
        raise Corrupt("file not found")
    if path.is_dir():
        raise Corrupt(directory_problem(path))
    if not path.is_file():
        raise Corrupt("not a regular file")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER.size:
                raise Corrupt(f"truncated GGUF header ({size} bytes, need {HEADER.size})")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        metadata, tensors = _scan_layout(buf)
        return metadata, tensors, np.frombuffer(buf, dtype=np.uint8)
    except OSError as exc:
        raise Corrupt(f"cannot read file ({exc.strerror or exc})") from None
