"""Quantized weights written to disk as they are made, so a streamed build's memory holds the
layer being quantized, not every quantized layer before it.

A 4-bit code array is one byte per element in numpy (``ml_dtypes.int4``); written, it is
packed two to a byte, as ONNX stores INT4. The graph then holds an ``ir.ExternalTensor``
pointing into the spill file, which ``ir.save`` copies into the engine's external data.
"""

from __future__ import annotations

import mmap
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx_ir as ir

from llmc.quant.protocol import QuantizedLinear

#: Arrays smaller than this stay in memory (scales, zero points, norm weights).
SPILL_THRESHOLD_BYTES = 64 << 10


class TensorSpill:
    """An append-only file of tensor bytes at ``path`` (created empty, replacing any file there).

    ``tensor`` returns an ``ir.ExternalTensor`` into the file for an array of at least
    ``threshold`` bytes (default ``SPILL_THRESHOLD_BYTES``), else an in-memory ``ir.Tensor``.
    Each write is flushed before the tensor is returned, so it can be read (memory-mapped) at
    once. Raises OSError when the file cannot be written."""

    def __init__(self, path: Path, threshold: int | None = None):
        self.path = path
        self.threshold = SPILL_THRESHOLD_BYTES if threshold is None else threshold
        self._file = open(path, "wb")  # noqa: SIM115 - held open across calls; closed by close()
        self.bytes_written = 0

    def tensor(self, array: np.ndarray, name: str) -> ir.TensorProtocol:
        """``array`` as a tensor named ``name``: external (in the spill file) when large."""
        tensor = ir.tensor(array, name=name)
        if array.nbytes < self.threshold:
            return tensor
        data = tensor.tobytes()  # 4-bit types packed, as ONNX stores them
        offset = self._file.tell()
        self._file.write(data)
        self._file.flush()
        self.bytes_written += len(data)
        return ir.ExternalTensor(
            self.path.name,
            offset,
            len(data),
            tensor.dtype,
            shape=tensor.shape,
            name=name,
            base_dir=self.path.parent,
        )

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TensorSpill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spill_array(array: np.ndarray, path: Path) -> np.ndarray:
    """``array`` written to ``path`` (raw bytes, replacing any file there) and memory-mapped
    back read-only: same dtype (an ``ml_dtypes`` one included), shape and values, its pages
    read from disk when used. Raises OSError when the file cannot be written."""
    contiguous = np.ascontiguousarray(array)
    contiguous.tofile(path)
    if contiguous.size == 0:
        return contiguous
    return np.memmap(path, dtype=contiguous.dtype, mode="r", shape=contiguous.shape)


def spill_linear(ql: QuantizedLinear, stem: Path) -> QuantizedLinear:
    """``ql`` with its codes (and a smoothing vector of ``SPILL_THRESHOLD_BYTES`` or more) on
    disk at ``stem.codes`` / ``stem.smoothing``, memory-mapped (``spill_array``); scales and
    zero points stay in memory. Raises OSError when a file cannot be written."""
    weight = replace(ql.weight, data=spill_array(ql.weight.data, stem.with_suffix(".codes")))
    smoothing = ql.smoothing
    if smoothing is not None and smoothing.nbytes >= SPILL_THRESHOLD_BYTES:
        smoothing = spill_array(smoothing, stem.with_suffix(".smoothing"))
    return replace(ql, weight=weight, smoothing=smoothing)


def drop_pages(array: object) -> None:
    """Give back the resident pages of a ``spill_array`` memory map (read again from disk if
    the array is used again); anything else is left alone. A mapped file's pages count in the
    process's resident memory once read, for as long as the mapping lives."""
    mapping = getattr(array, "_mmap", None)
    if isinstance(mapping, mmap.mmap):
        mapping.madvise(mmap.MADV_DONTNEED)
