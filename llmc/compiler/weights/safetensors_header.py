"""Read a safetensors file's header and check it against the file before any weight is read.

Every read of a safetensors checkpoint goes through here: ``model_source.resolve_model`` checks
a checkpoint's files when it is resolved, and ``checkpoint_weights.index_safetensors`` (the
streamed build's byte ranges, ``memory.engine_size``'s shapes) reads its index from these headers. A
header is only metadata the file's writer chose: a hostile or damaged one can give two tensors
the same bytes, ranges past the end of the file, a shape its bytes cannot hold, or a header
length of terabytes. Each rule below is checked on the header alone (no tensor data is read) and
the first one broken is refused with a ``ModelSourceError`` naming the file, the tensor and the
rule.

Layout (huggingface/safetensors, "Format"): an 8-byte little-endian header length N, N bytes of
JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
the data region; offsets count from the start of the data region. Rules, those the safetensors
library's own loader holds a file to (``safetensors/src/tensor.rs``, ``Metadata::validate``; it
refuses a gap or trailing bytes too): the header fits in the file and is a JSON object with no
key twice; each tensor's dtype is known, its shape a list of non-negative integers, ``begin <=
end`` within the data region, ``end - begin`` the shape's element count times the dtype's size;
the tensors cover the data region end to end, no two sharing a byte, no byte left over.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from llmc.errors import ModelSourceError

#: Bytes per element of the safetensors dtypes a checkpoint of weights holds (those
#: ``checkpoint_weights`` reads); any other is refused.
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}
#: A header longer than this is refused unread: real headers are tens of KB to a few MB
#: (about 150 bytes per tensor), and the length is the first thing a hostile file controls.
MAX_HEADER_BYTES = 100 << 20
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor of a safetensors header, checked against its file.

    Attributes:
        file: the ``.safetensors`` file.
        name: the tensor's name (the state-dict key).
        dtype: the safetensors dtype name (a key of ``DTYPE_SIZES``).
        shape: the shape, row-major.
        offset: byte offset of its data from the start of the file.
        length: bytes of data (the shape's elements times the dtype's size).
    """

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


def read_safetensors_headers(files: tuple[Path, ...] | list[Path]) -> dict[str, SafetensorsTensor]:
    """Name -> tensor of every tensor of ``files`` (a checkpoint's shards), each header checked
    (``read_safetensors_header``). Raises ModelSourceError for a broken rule or a name found in
    two shards."""
    tensors: dict[str, SafetensorsTensor] = {}
    for file in files:
        for tensor in read_safetensors_header(file):
            if tensor.name in tensors:
                raise ModelSourceError(
                    f"tensor {tensor.name} is in both {tensors[tensor.name].file} and {file}; "
                    "a checkpoint holds each tensor once: convert it again"
                )
            tensors[tensor.name] = tensor
    return tensors


def read_safetensors_header(file: Path) -> tuple[SafetensorsTensor, ...]:
    """The tensors of the safetensors ``file``, in data order, every rule of the module
    docstring checked. Reads the header only.

    Raises:
        ModelSourceError: the file cannot be read, or breaks a rule; the message names the
            file, the tensor (where one is at fault) and the rule.
    """
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            if size < 8:
                raise _fail(file, f"it has {size} bytes, fewer than the 8-byte header length")
            n = int.from_bytes(f.read(8), "little")
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise _fail(
                    file,
                    f"its header length {n} runs past the end of the file ({size} bytes)"
                    if n > size - 8
                    else f"its header length {n} is over the {MAX_HEADER_BYTES}-byte limit",
                )
            raw = f.read(n)
    except OSError as e:
        raise ModelSourceError(f"cannot read the safetensors file {file}: {e}") from e
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError both are
        raise _fail(file, f"its header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise _fail(file, "its header is not a JSON object of tensors")
    data_size = size - 8 - n
    tensors = [
        _tensor(file, name, entry, 8 + n, data_size)
        for name, entry in header.items()
        if name != METADATA_KEY
    ]
    tensors.sort(key=lambda t: (t.offset, t.length))
    end, last = 8 + n, None  # the data region is the tensors end to end, as the library reads it
    for t in tensors:
        if t.offset < end:
            raise _fail(
                file,
                f"tensors {last.name} and {t.name} overlap (bytes {last.offset} to {end} and "
                f"{t.offset} to {t.offset + t.length}); each tensor needs bytes of its own",
            )
        if t.offset > end:
            after = f"after {last.name}" if last is not None else "at the start"
            raise _fail(file, f"tensor {t.name} leaves a gap of {t.offset - end} bytes {after}")
        end, last = t.offset + t.length, t
    if end != size:
        raise _fail(file, f"its data region has {size - end} bytes past its last tensor")
    return tuple(tensors)


def _tensor(file: Path, name: str, entry: object, base: int, data_size: int) -> SafetensorsTensor:
    """The header entry ``name: entry`` checked; ``base``: the data region's offset in the
    file, ``data_size`` its length."""
    if not isinstance(entry, dict):
        raise _fail(file, f"tensor {name}'s entry is not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:  # a list is no dict key
        known = ", ".join(DTYPE_SIZES)
        raise _fail(file, f"tensor {name} has dtype {dtype!r}, not one of {known}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _fail(file, f"tensor {name}'s shape {shape!r} is not a list of integers >= 0")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_count(o) for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise _fail(
            file,
            f"tensor {name}'s data_offsets {offsets!r} are not [begin, end], 0 <= begin <= end",
        )
    begin, end = offsets
    if end > data_size:
        raise _fail(
            file,
            f"tensor {name}'s data (bytes {begin} to {end} of the data region) runs past the "
            f"end of the file, whose data region has {data_size} bytes",
        )
    need = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != need:
        raise _fail(
            file,
            f"tensor {name} takes {end - begin} bytes, but its shape {shape} of {dtype} "
            f"needs {need}",
        )
    return SafetensorsTensor(file, name, dtype, tuple(shape), base + begin, end - begin)


def _is_count(value: object) -> bool:
    # bool is an int to Python, never to a header
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's pairs as a dict, refusing a key given twice (``json`` keeps the last
    silently: two readers could then disagree on which bytes a tensor has)."""
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} appears twice")
        result[key] = value
    return result


def _fail(file: Path, what: str) -> ModelSourceError:
    return ModelSourceError(
        f"{file} is not a valid safetensors file: {what}; the file is damaged or was not "
        "written as safetensors: download or convert the checkpoint again"
    )
