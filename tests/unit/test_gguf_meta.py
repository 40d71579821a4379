"""The GGUF header reader against the ``gguf`` package: a file written by ``gguf.GGUFWriter``
with every value type and element/quantized tensors, and the real model file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from kvserve.model.gguf_meta import read_gguf


def reference_metadata(path_or_reader: str | GGUFReader) -> dict:
    """The fields as the ``gguf`` package's reader decodes them."""
    reader = path_or_reader if isinstance(path_or_reader, GGUFReader) else GGUFReader(path_or_reader, "r")
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def write_sample(path: Path) -> dict[str, np.ndarray]:
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo \u2581world")
    w.add_array("t.strs", ["a", "", "ünï", "<|im_end|>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    tensors = {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((4, 2, 8)).astype(np.float16),
    }
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    q = rng.standard_normal((6, 64)).astype(np.float32)
    tensors["c.q8_0"] = quantize(q, Q.Q8_0)
    w.add_tensor("c.q8_0", tensors["c.q8_0"], raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_every_value_type_and_tensor_kind_reads_as_the_gguf_package_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "sample.gguf"
    tensors = write_sample(path)
    got = read_gguf(str(path))
    ref = reference_metadata(str(path))
    assert got.metadata == ref
    assert list(got.metadata) == list(ref)
    assert got.metadata["t.bool"] is True and got.metadata["t.strs"][2] == "ünï"
    assert isinstance(got.metadata["t.f32"], float) and got.metadata["t.f32"] == float(np.float32(0.1))
    reader = GGUFReader(str(path), "r")
    assert [t.name for t in got.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(got.tensors, reader.tensors):
        assert mine.tensor_type == theirs.tensor_type
        assert mine.shape == tuple(int(x) for x in theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        np.testing.assert_array_equal(mine.data, theirs.data)
        np.testing.assert_array_equal(mine.data, tensors[mine.name])


def test_the_model_file_reads_as_the_gguf_package_reads_it(smollm_path: str) -> None:
    got = read_gguf(smollm_path)
    reader = GGUFReader(smollm_path, "r")  # parsed once: ~2 s for SmolLM2's vocabulary
    assert got.metadata == reference_metadata(reader)
    assert len(got.tensors) == len(reader.tensors)
    for mine, theirs in zip(got.tensors, reader.tensors):
        assert (mine.name, mine.tensor_type, mine.shape) == (theirs.name, theirs.tensor_type, tuple(theirs.shape))
        assert mine.data.shape == theirs.data.shape
        assert mine.data[:1].tobytes() == theirs.data[:1].tobytes()


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(str(path))


def _rss_file_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return 0


def test_release_drops_a_tensors_pages_and_data_stays_readable(smollm_path):
    got = read_gguf(smollm_path)
    t = max(got.tensors, key=lambda t: t.data.nbytes)  # the embedding, ~29 MiB
    got.release(t)
    base = _rss_file_kib()
    total = int(t.data.astype(np.uint64).sum())  # touches every page
    assert _rss_file_kib() - base > t.data.nbytes // 1024 // 2
    got.release(t, 0, t.data.shape[0] // 2)  # the first half of the rows
    assert _rss_file_kib() - base < t.data.nbytes // 1024 * 3 // 4
    got.release(t)
    assert _rss_file_kib() - base < t.data.nbytes // 1024 // 8
    assert int(t.data.astype(np.uint64).sum()) == total  # faults back in from the file
