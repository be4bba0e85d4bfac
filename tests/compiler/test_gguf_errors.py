"""Issue 17 item 9: a malformed GGUF file is a ``ModelSourceError`` naming the file and the byte.

A small GGUF file is written with the ``gguf`` package's writer, then truncated or corrupted at
chosen offsets (found with the ``gguf`` reader on the good file). Property tests truncate and
flip bytes at random: ``check_gguf`` either refuses the file with ``ModelSourceError`` or the
``gguf`` reader (what transformers uses) reads it without error.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmc.compiler.frontend.gguf_file import check_gguf
from llmc.compiler.frontend.model_source import resolve_model
from llmc.errors import ModelSourceError

_FIXTURE_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write_gguf(path: Path) -> Path:
    """Metadata of each kind (string, u32, string and float arrays) and three tensors: two
    float32, one Q8_0 (blocks of 32 elements in 34 bytes)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.add_tensor("output.weight", np.ones((2, 8), dtype=np.float32))
    q8 = np.zeros((2, 34), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "model.gguf")


def refused_at(path: Path, offset: int, fragment: str) -> str:
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(path))
    message = str(raised.value)
    assert f"{path} is not a valid GGUF file: at byte {offset} of" in message, message
    assert fragment in message, message
    assert "download it again" in message
    return message


def patch(path: Path, offset: int, fmt: str, value) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into("<" + fmt, data, offset, value)
    path.write_bytes(bytes(data))


def tensor_info(path: Path, name: str) -> tuple[int, int]:
    """Byte offsets of tensor ``name``'s info and of its first dimension."""
    field = next(t.field for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    return field.offset, field.offset + 8 + len(name.encode()) + 4


def data_end(path: Path) -> int:
    """Where the last tensor's data ends (the writer pads the file to the alignment after it)."""
    return max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)


def test_good_file_agrees_with_the_gguf_reader(good: Path):
    reader = gguf.GGUFReader(str(good))
    summary = check_gguf(good)
    assert (summary.version, summary.num_tensors, summary.alignment) == (3, 3, 32)
    assert summary.data_offset == reader.data_offset
    assert summary.num_metadata == len(reader.fields) - 3  # the reader adds the 3 header fields
    assert resolve_model(str(good)).gguf_file == "model.gguf"


@pytest.mark.parametrize(
    ("size", "offset", "fragment"),
    [
        (0, 0, "the header needs 24 bytes"),
        (10, 10, "the header needs 24 bytes"),
        (30, 16, "the metadata count is 4, more than the rest of the file can hold"),
        (90, 69, "the length of the key of metadata entry 1 is 17, more than"),
        (150, 139, "the length of the value of 'tokenizer.ggml.tokens' is 3, more than"),
        (300, 8, "the tensor count is 3, more than the file can hold"),
        (400, 395, "the file ends inside the data offset of 'blk.0.ffn_up.weight'"),
    ],
)
def test_truncated_header(good: Path, size: int, offset: int, fragment: str):
    good.write_bytes(good.read_bytes()[:size])
    refused_at(good, offset, fragment)


def test_truncated_tensor_data(good: Path):
    start, _ = tensor_info(good, "blk.0.ffn_up.weight")
    good.write_bytes(good.read_bytes()[: data_end(good) - 1])
    refused_at(good, start, "tensor 'blk.0.ffn_up.weight''s data (bytes 608 to 676) runs past")


def test_bad_magic_and_version(good: Path):
    data = good.read_bytes()
    good.write_bytes(b"GGML" + data[4:])
    refused_at(good, 0, "the magic is b'GGML', not b'GGUF'")
    good.write_bytes(data)
    patch(good, 4, "I", 7)
    refused_at(good, 4, "version 7 is not one of (2, 3)")


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "fragment"),
    [
        (8, "Q", 2**63, "the tensor count is 9223372036854775808, more than the file can hold"),
        (16, "Q", 2**62, "the metadata count is 4611686018427387904, more than"),
        (24, "Q", 2**60, "the length of the key of metadata entry 0 is 1152921504606846976"),
        (69 + 8 + 17, "I", 99, "'llama.block_count' has unknown value type 99"),
    ],
)
def test_absurd_counts_lengths_and_types(good, offset, fmt, value, fragment):
    patch(good, offset, fmt, value)
    refused_at(good, offset, fragment)


def test_array_longer_than_the_file(good: Path):
    key = b"tokenizer.ggml.scores"
    length_at = 177 + 8 + len(key) + 4 + 4  # key, value type, item type, then the length
    patch(good, length_at, "Q", 2**61)
    refused_at(good, length_at, "the length of the value of 'tokenizer.ggml.scores' is")


def test_tensor_offset_past_the_end(good: Path):
    start, dims = tensor_info(good, "output.weight")
    patch(good, dims + 2 * 8 + 4, "Q", 1 << 40)  # after the 2 dims and the type: the offset
    refused_at(good, start, "'output.weight''s data (bytes")


def test_tensor_shape_and_type(good: Path):
    data = good.read_bytes()
    start, dims = tensor_info(good, "blk.0.ffn_up.weight")
    patch(good, dims, "Q", 33)
    refused_at(good, start, "has shape [33, 2], whose first dimension is not a multiple of")
    good.write_bytes(data)
    # The name's length 19 -> 35 swallows the rank and shape, leaving a quantized scalar (found
    # by changing every header byte to every value: the gguf reader raised IndexError).
    patch(good, start, "Q", 35)
    refused_at(good, start, "has shape [], whose first dimension is not a multiple of")
    good.write_bytes(data)
    patch(good, dims - 4, "I", 9)  # n_dims
    refused_at(good, start, "has 9 dimensions (at most 4)")
    good.write_bytes(data)
    patch(good, dims + 2 * 8, "I", 1000)  # ggml type
    refused_at(good, start, "unknown ggml type 1000")


def test_non_utf8_key(good: Path):
    data = bytearray(good.read_bytes())
    data[32] = 0xFF  # first byte of "general.architecture"
    good.write_bytes(bytes(data))
    refused_at(good, 24, "the key of metadata entry 0 is not UTF-8")


@_FIXTURE_SETTINGS
@given(fraction=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_every_truncation_is_refused(good: Path, fraction: float):
    truncated = good.with_name("truncated.gguf")
    truncated.write_bytes(good.read_bytes()[: int(data_end(good) * fraction)])
    with pytest.raises(ModelSourceError, match=re.escape(str(truncated)) + ".* at byte"):
        check_gguf(truncated)


@_FIXTURE_SETTINGS
@given(position=st.integers(min_value=0, max_value=415), byte=st.integers(0, 255))
def test_a_changed_header_byte_is_refused_or_readable(good: Path, position: int, byte: int):
    """Whatever byte of the header (its first 416 bytes) is changed to, ``check_gguf``
    refuses the file with ModelSourceError or the ``gguf`` reader reads it without error."""
    data = bytearray(good.read_bytes())
    data[position] = byte
    corrupt = good.with_name("corrupt.gguf")
    corrupt.write_bytes(bytes(data))
    try:
        check_gguf(corrupt)
    except ModelSourceError as error:
        assert f"{corrupt} is not a valid GGUF file" in str(error)
        return
    gguf.GGUFReader(str(corrupt))
