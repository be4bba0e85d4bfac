"""Checkpoint tensors read lazily: a safetensors checkpoint as an index of byte ranges.

A streaming build never holds the checkpoint in memory: each graph initializer is bound to the
byte range of its tensor in the checkpoint's ``.safetensors`` files, and read when the tensor is
written (``onnx_ir.save`` writes one tensor at a time). A tensor already in the engine's dtype
is an ``onnx_ir.ExternalTensor`` over the file (memory-mapped, no copy); one in another dtype
(a bfloat16 checkpoint for a float32 engine) is an ``onnx_ir.LazyTensor`` that converts on read.
A GGUF file binds the same way through its own index (``gguf_weights``: dequantized on read).

The byte ranges come from the files' headers, each checked against its file first (ranges
inside the file, lengths their shapes', no two tensors sharing bytes: ``safetensors_header``),
so a range read here is always the tensor's own bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx_ir as ir

from llmc.compiler.weights.safetensors_header import read_safetensors_headers
from llmc.errors import ModelSourceError

# safetensors dtype names -> ONNX element types: one per ``safetensors_header.DTYPE_SIZES`` key.
_DTYPES = {
    "F32": ir.DataType.FLOAT,
    "F16": ir.DataType.FLOAT16,
    "BF16": ir.DataType.BFLOAT16,
    "F64": ir.DataType.DOUBLE,
    "I64": ir.DataType.INT64,
    "I32": ir.DataType.INT32,
}


class CheckpointTensor(Protocol):
    """One checkpoint tensor, read when asked: ``TensorLocation`` (safetensors bytes) or
    ``gguf_weights.GgufTensor`` (dequantized on read)."""

    @property
    def dtype(self) -> ir.DataType:
        """The element type ``read`` returns."""
        ...

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape ``read`` returns."""
        ...

    def read(self) -> np.ndarray:
        """The tensor's values, ``dtype`` and ``shape``."""
        ...


@dataclass(frozen=True)
class TensorLocation:
    """Where one checkpoint tensor's bytes are: ``length`` bytes at ``offset`` of ``file``."""

    file: Path
    offset: int
    length: int
    dtype: ir.DataType
    shape: tuple[int, ...]

    def read(self) -> np.ndarray:
        """The tensor as a numpy array in its stored dtype (bfloat16 as ``ml_dtypes.bfloat16``),
        read through a memory map. Shape ``self.shape``."""
        mm = np.memmap(
            self.file, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.length,)
        )
        return mm.view(self.dtype.numpy()).reshape(self.shape)


def index_safetensors(files: list[Path] | tuple[Path, ...]) -> dict[str, TensorLocation]:
    """Name -> ``TensorLocation`` of every tensor in ``files`` (a checkpoint's shards).

    Reads only the headers, each checked against its file (``safetensors_header``). Raises
    ModelSourceError for a file that is not valid safetensors (the message names the file, the
    tensor and the rule) or a name found in two shards.
    """
    return {
        name: TensorLocation(t.file, t.offset, t.length, _DTYPES[t.dtype], t.shape)
        for name, t in read_safetensors_headers(files).items()
    }


#: ``meta`` key of a converting ``lazy_tensor``: the ``TensorLocation`` it reads.
CHECKPOINT_SOURCE = "llmc.checkpoint_source"


def external_tensor(loc: TensorLocation, name: str) -> ir.ExternalTensor:
    """The safetensors bytes at ``loc`` as an ONNX IR tensor named ``name``, in their stored
    dtype (memory-mapped when read, no copy)."""
    return ir.ExternalTensor(
        loc.file.name,
        loc.offset,
        loc.length,
        loc.dtype,
        shape=ir.Shape(loc.shape),
        name=name,
        base_dir=loc.file.parent,
    )


def lazy_tensor(loc: CheckpointTensor, name: str, dtype: ir.DataType) -> ir.TensorProtocol:
    """An ONNX IR tensor named ``name`` with ``loc``'s values in ``dtype``: a safetensors
    file's bytes as they are when the dtypes agree, else read (and converted: float types
    only) when the tensor is written. A converted safetensors tensor names its source under
    ``meta[CHECKPOINT_SOURCE]``, so a weight written back at the checkpoint's width is the
    checkpoint's bytes (``stored_weights.store_weights``)."""
    if isinstance(loc, TensorLocation) and loc.dtype == dtype:
        return external_tensor(loc, name)

    def convert() -> ir.TensorProtocol:
        return ir.tensor(loc.read().astype(dtype.numpy(), copy=False), name=name)

    tensor = ir.LazyTensor(convert, dtype=dtype, shape=ir.Shape(loc.shape), name=name)
    if isinstance(loc, TensorLocation):
        tensor.meta[CHECKPOINT_SOURCE] = loc
    return tensor


def bind_initializers(
    graph: ir.Graph,
    index: Mapping[str, CheckpointTensor],
    buffers: dict[str, np.ndarray],
    dtype: ir.DataType,
    aliases: dict[str, str] | None = None,
    prefix: str = "model.",
) -> None:
    """Give every initializer of ``graph`` (exported from a model on the meta device, so
    without values) its checkpoint tensor, lazily.

    ``index``: state-dict name -> checkpoint tensor (``index_safetensors``, ``index_gguf``).
    An initializer is named after the module's state-dict key with ``prefix`` (the export's
    wrapper) in front. Float tensors take ``dtype``; ``buffers`` holds the values of tensors a
    model computes at construction instead of loading them (rotary ``inv_freq``, embedding
    scales). ``aliases`` maps a tied weight's name to the checkpoint tensor it shares
    (transformers' ``all_tied_weights_keys``: ``lm_head.weight`` ->
    ``model.embed_tokens.weight``); the export names a shared tensor after either. Raises
    ModelSourceError naming the initializers found in neither.
    """
    missing = []
    for name, value in graph.initializers.items():
        key = name.removeprefix(prefix)
        if key not in index and key not in buffers:
            key = (aliases or {}).get(key, key)
        if key in index:
            loc = index[key]
            target = dtype if loc.dtype.is_floating_point() else loc.dtype
            value.const_value = lazy_tensor(loc, name, target)
        elif key in buffers:
            array = buffers[key]
            if np.issubdtype(array.dtype, np.floating):
                array = array.astype(dtype.numpy())
            value.const_value = ir.tensor(array, name=name)
        else:
            missing.append(key)
    if missing:
        raise ModelSourceError(
            f"{len(missing)} graph weight(s) are not in the checkpoint: {', '.join(missing[:5])}"
        )
