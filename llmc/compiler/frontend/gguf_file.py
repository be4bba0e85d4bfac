"""Check a GGUF file's layout before any library reads it.

The ``gguf`` package's reader (used by transformers) trusts the file: a truncated header, a bad
magic, a string or array length past the end, or a tensor whose data lies past the end of the
file surfaces as IndexError, ValueError, KeyError or a memory error deep inside it. ``check_gguf``
walks the same layout with every length and offset bounded by the file's size, and refuses the
first thing wrong with a ``ModelSourceError`` naming the file and the byte offset.

Layout (ggml ``docs/gguf.md``, versions 2 and 3): magic ``GGUF``, version u32, tensor count u64,
metadata count u64; metadata as (key string, type u32, value); tensor infos as (name string,
n_dims u32, dims u64[n_dims], ggml type u32, data offset u64); padding to ``general.alignment``
(default 32); tensor data. A string is a u64 length and that many UTF-8 bytes. Files written on
a big-endian host are read with the other byte order, as the ``gguf`` reader does.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from llmc.errors import ModelSourceError

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
_HEADER_BYTES = 24  # magic, version, tensor count, metadata count
# Scalar value types (GGUFValueType) -> struct format; 8 is STRING, 9 is ARRAY.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_SCALARS |= {10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# Fewest bytes one item can take, to refuse an absurd count before looping over it.
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims 0, type, offset


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor info of the header.

    Attributes:
        name: the GGUF tensor name (``blk.0.attn_q.weight``).
        dims: the shape in ggml order, fastest-moving dimension first (numpy's reversed).
        ggml_type: the ``gguf.GGMLQuantizationType`` value it is stored in.
        offset: byte offset of its data from the start of the file.
        num_bytes: bytes its data takes.
    """

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    num_bytes: int


@dataclass(frozen=True)
class GgufSummary:
    """What ``check_gguf`` found in a well-formed file.

    Attributes:
        version: the GGUF version (2 or 3).
        num_tensors: tensor infos in the header.
        num_metadata: metadata key/value pairs.
        alignment: bytes the tensor data is aligned to.
        data_offset: byte offset of the tensor data section.
        architecture: ``general.architecture`` (a string value), or None without one.
        little_endian: whether the file was written little-endian (as almost all are).
        tensors: the tensor infos, in header order.
        metadata: the scalar and string metadata values by key (arrays are checked, not
            kept: a vocabulary has 10^5 items).
    """

    version: int
    num_tensors: int
    num_metadata: int
    alignment: int
    data_offset: int
    architecture: str | None = None
    little_endian: bool = True
    tensors: tuple[GgufTensorInfo, ...] = ()
    metadata: dict[str, object] = field(default_factory=dict)


class _Reader:
    """Bounded reads from the mapped file; every failure names the byte offset."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path, order: str = "<") -> None:
        self.buf, self.path, self.order, self.pos = buf, path, order, 0
        self.size = len(buf)

    def fail(self, what: str, offset: int | None = None) -> ModelSourceError:
        at = self.pos if offset is None else offset
        return ModelSourceError(
            f"{self.path} is not a valid GGUF file: at byte {at} of {self.size}, {what}; "
            "download it again or convert the checkpoint to GGUF again"
        )

    def scalar(self, fmt: str, what: str):
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.fail(f"the file ends inside {what}")
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += width
        return value

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count of items that each take at least ``min_item_bytes``."""
        start = self.pos
        n = self.scalar("Q", what)
        if n * min_item_bytes > self.size - self.pos:
            raise self.fail(f"{what} is {n}, more than the rest of the file can hold", start)
        return n

    def string(self, what: str) -> str:
        start = self.pos
        length = self.count(f"the length of {what}", 1)
        raw = bytes(self.buf[self.pos : self.pos + length])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8", start) from None
        self.pos += length
        return text

    def value(self, kind: int, what: str) -> object:
        """Read one metadata value of type ``kind``; arrays of scalars are skipped, not kept."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise self.fail(f"{what} has unknown value type {kind}", self.pos - 4)
        item_kind = self.scalar("I", f"the item type of {what}")
        if item_kind in _SCALARS:
            width = struct.calcsize(_SCALARS[item_kind])
            n = self.count(f"the length of {what}", width)
            self.pos += n * width
            return None
        if item_kind not in (_STRING, _ARRAY):
            raise self.fail(f"{what} has unknown item type {item_kind}", self.pos - 4)
        n = self.count(f"the length of {what}", 8 if item_kind == _STRING else 12)
        if item_kind == _STRING:
            self.skip_strings(n, what)
        for i in range(n if item_kind == _ARRAY else 0):
            self.value(item_kind, f"item {i} of {what}")
        return None

    def skip_strings(self, n: int, what: str) -> None:
        """Check ``n`` strings in a row: ``string`` inlined, as a vocabulary has 10^5 of them."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, struct.Struct(self.order + "Q")
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"the file ends inside item {i} of {what}")
            (length,) = unpack.unpack_from(buf, pos)
            if length > size - pos - 8:
                raise self.fail(f"the length of item {i} of {what} is {length}, past the end", pos)
            try:
                buf[pos + 8 : pos + 8 + length].decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail(f"item {i} of {what} is not UTF-8", pos) from None
            pos += 8 + length
        self.pos = pos


def check_gguf(path: str | Path) -> GgufSummary:
    """Walk the header of the GGUF file at ``path`` and check that every tensor's data lies
    inside the file. Reads the header only (memory-mapped); no tensor data is read.

    Raises:
        ModelSourceError: the file cannot be opened, or is malformed: too short, bad magic,
            unsupported version, a count, length or type that cannot be, a duplicate key or
            tensor name, a bad ``general.alignment``, or tensor data outside the file. The
            message names the file and the byte offset of the first fault.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < _HEADER_BYTES:
                raise _Reader(f.read(), path).fail(f"the header needs {_HEADER_BYTES} bytes", size)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _check(_Reader(buf, path))
    except OSError as error:
        raise ModelSourceError(f"cannot read the GGUF file {path}: {error}") from error


def _unique_string(r: _Reader, seen: set[str], what: str, kind: str) -> tuple[str, int]:
    """Read a string (``what``, for errors) that must not be in ``seen``; returns it and where
    it started. Raises ModelSourceError naming ``kind`` when it repeats."""
    start = r.pos
    value = r.string(what)
    if value in seen:
        raise r.fail(f"{kind} {value!r} appears twice", start)
    seen.add(value)
    return value, start


def _check(r: _Reader) -> GgufSummary:
    if bytes(r.buf[:4]) != b"GGUF":
        raise r.fail(f"the magic is {bytes(r.buf[:4])!r}, not b'GGUF'", 0)
    r.pos = 4
    version = r.scalar("I", "the version")
    if version & 0xFFFF == 0:  # written on a host of the other byte order
        r.order = ">"
        version = struct.unpack_from(">I", r.buf, 4)[0]
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"version {version} is not one of {SUPPORTED_VERSIONS}", 4)
    num_tensors = r.scalar("Q", "the tensor count")
    num_metadata = r.count("the metadata count", _MIN_KV_BYTES)
    alignment = DEFAULT_ALIGNMENT
    architecture = None
    keys: set[str] = set()
    metadata: dict[str, object] = {}
    for i in range(num_metadata):
        key, start = _unique_string(r, keys, f"the key of metadata entry {i}", "metadata key")
        kind = r.scalar("I", f"the type of {key!r}")
        value = r.value(kind, f"the value of {key!r}")
        if value is not None:
            metadata[key] = value
        if key == "general.alignment":
            if kind != _UINT32 or value == 0 or value & (value - 1):
                raise r.fail(f"general.alignment must be a u32 power of two, got {value!r}", start)
            alignment = value
        if key == "general.architecture" and kind == _STRING:
            architecture = value
    if num_tensors * _MIN_TENSOR_INFO_BYTES > r.size - r.pos:
        raise r.fail(f"the tensor count is {num_tensors}, more than the file can hold", 8)
    tensors = []
    names: set[str] = set()
    for i in range(num_tensors):
        name, start = _unique_string(r, names, f"the name of tensor {i}", "tensor name")
        n_dims = r.scalar("I", f"the rank of {name!r}")
        if n_dims > MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})", start)
        dims = [r.scalar("Q", f"the shape of {name!r}") for _ in range(n_dims)]
        ggml_type = r.scalar("I", f"the type of {name!r}")
        offset = r.scalar("Q", f"the data offset of {name!r}")
        tensors.append((start, name, dims, ggml_type, offset))
    data_offset = -(-r.pos // alignment) * alignment
    infos = [_tensor_info(r, t, alignment, data_offset) for t in tensors]
    return GgufSummary(
        version,
        num_tensors,
        num_metadata,
        alignment,
        data_offset,
        architecture,
        r.order == "<",
        tuple(infos),
        metadata,
    )


def _tensor_info(r: _Reader, tensor: tuple, alignment: int, data_offset: int) -> GgufTensorInfo:
    """The checked ``GgufTensorInfo`` of one tensor-info record ``tensor`` = (start, name,
    dims, ggml type, offset): a known type, whole blocks per row, aligned data within the
    file. Raises what ``r.fail`` raises."""
    from gguf.constants import GGML_QUANT_SIZES

    start, name, dims, ggml_type, offset = tensor
    sizes = GGML_QUANT_SIZES.get(ggml_type)  # keyed by an IntEnum: an int finds it
    if sizes is None:
        raise r.fail(f"tensor {name!r} has unknown ggml type {ggml_type}", start)
    block_size, type_size = sizes
    if (dims[0] if dims else 1) % block_size:  # rows are whole blocks
        raise r.fail(
            f"tensor {name!r} has shape {dims}, whose first dimension is not a multiple "
            f"of its type's block size {block_size}",
            start,
        )
    if offset % alignment:
        raise r.fail(f"tensor {name!r}'s data offset {offset} is not aligned", start)
    num_elements = 1
    for d in dims:
        num_elements *= d
    num_bytes = num_elements * type_size // block_size
    end = data_offset + offset + num_bytes
    if end > r.size:
        raise r.fail(
            f"tensor {name!r}'s data (bytes {data_offset + offset} to {end}) runs past the "
            "end of the file",
            start,
        )
    return GgufTensorInfo(name, tuple(dims), ggml_type, data_offset + offset, num_bytes)
