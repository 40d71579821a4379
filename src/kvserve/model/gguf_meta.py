"""GGUF metadata as plain Python values (the only place that parses GGUF key/value fields)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


def _field_value(field: Any) -> Any:
    """Decode one ReaderField into str / int / float / bool / list."""
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[1] if len(types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if not field.data:
            return []
        # Numeric arrays: concatenate the parts in one go (tokenizer scores/types are 100k+ long).
        arr = np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data])
        return arr.tolist()
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    val = field.parts[field.data[0]]
    scalar = np.asarray(val).reshape(-1)[0]
    if types[0] == GGUFValueType.BOOL:
        return bool(scalar)
    return scalar.item()


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/value fields of a GGUF file, decoded. Keys starting with ``GGUF.`` are skipped."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = _field_value(field)
    return out


def read_metadata_file(path: str) -> dict[str, Any]:
    return read_metadata(GGUFReader(path, "r"))
