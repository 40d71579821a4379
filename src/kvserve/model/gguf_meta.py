"""GGUF file → metadata as plain Python values + tensor views of the mapped file.

The only place that parses the GGUF header. ``gguf.GGUFReader`` builds a numpy view per array
element (a 49k-token vocabulary and its merges are ~150k of them: seconds of start-up); this
reads the same layout with ``struct`` over one read-only ``mmap``, and the tensor data as numpy
views of that mapping in the shapes the reader gives (see ``quant_shape_to_byte_shape``).

    file:  magic "GGUF" · u32 version (2, 3) · u64 n_tensors · u64 n_kv
           n_kv × (string key · u32 type · value)            string = u64 length · UTF-8 bytes
           n_tensors × (string name · u32 n_dims · u64 dims[n_dims] (ne0 first) · u32 ggml type
                        · u64 offset from the data start)
           padding to ``general.alignment`` (default 32) · tensor data
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_SCALAR = {  # value type → struct format (little-endian)
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}
_ELEMENT = {  # ggml types whose data the reader exposes as elements rather than bytes
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: ne0 (the contiguous dimension) first
    data: np.ndarray  # read-only view of the file: elements, or bytes [..., row bytes] if quantized
    offset: int = 0  # of the data, in the file


@dataclass(frozen=True)
class GGUFContents:
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]
    mapping: mmap.mmap | None = None

    def release(self, t: GGUFTensor, i: int = 0, j: int | None = None) -> None:
        """Drop the file pages wholly inside rows [i, j) of ``t`` (its outermost dimension;
        default all of it) from this process's memory. They stay in the page cache and fault
        back in if the view is read again: a loader that releases what it has repacked never
        holds the file's touched pages and the repacked copy of the same weights at once."""
        if self.mapping is None or t.data.nbytes == 0:
            return
        n = t.data.shape[0] if t.data.ndim else 1
        row = t.data.nbytes // n
        start, end = t.offset + i * row, t.offset + (n if j is None else j) * row
        lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            self.mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.off = buf, 0

    def unpack(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.unpack("<Q")
        s = self.buf[self.off : self.off + n]
        self.off += n
        return s.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            sub, n = self.unpack("<I"), self.unpack("<Q")
            if sub == GGUFValueType.STRING:
                return [self.string() for _ in range(n)]
            if sub == GGUFValueType.ARRAY:
                return [self.value(sub) for _ in range(n)]
            dt = np.dtype(_SCALAR[GGUFValueType(sub)])
            arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.off)
            self.off += n * dt.itemsize
            return arr.tolist()
        return self.unpack(_SCALAR[GGUFValueType(vtype)])


def read_gguf(path: str) -> GGUFContents:
    """Parse ``path``'s header; tensor data stay mapped (the mapping closes with the last view)."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != _MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    cur = _Cursor(buf)
    cur.off = 4
    version = cur.unpack("<I")
    if version not in _VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported (little-endian v2/v3)")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
        infos.append((name, GGMLQuantizationType(cur.unpack("<I")), dims, cur.unpack("<Q")))
    align = int(meta.get("general.alignment", 32))
    if align <= 0 or align & (align - 1):
        raise ValueError(f"{path}: invalid general.alignment {align}")
    start = -(-cur.off // align) * align
    tensors = []
    seen: set[str] = set()
    for name, qtype, dims, offset in infos:
        if name in seen:
            raise ValueError(f"{path}: duplicated tensor '{name}'")
        seen.add(name)
        shape = tuple(reversed(dims))
        n = int(np.prod(dims))
        if qtype in _ELEMENT:
            dt, count = np.dtype(_ELEMENT[qtype]), n
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            dt, count = np.dtype(np.uint8), n * size // block
            shape = quant_shape_to_byte_shape(shape, qtype)
        data = np.frombuffer(buf, dtype=dt, count=count, offset=start + offset).reshape(shape)
        tensors.append(GGUFTensor(name, qtype, dims, data, start + offset))
    header = -(-cur.off // mmap.PAGESIZE) * mmap.PAGESIZE
    buf.madvise(mmap.MADV_DONTNEED, 0, min(header, len(buf)))  # the header is parsed: drop its pages
    return GGUFContents(meta, tensors, buf)


def read_metadata_file(path: str) -> dict[str, Any]:
    return read_gguf(path).metadata
