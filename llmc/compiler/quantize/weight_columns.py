"""A weight read a slice of output channels at a time from its 16-bit stored bytes.

A vocabulary projection is the widest weight of a model (a 3B model's tied 128,256 x 3,072 table
is 0.79 GB in bfloat16, 1.58 GB widened to float32). A format that quantizes output channels a
slice at a time (``QuantFormat.reads_column_slices``) gets it as ``WeightColumns``: each slice is
widened when indexed and the stored pages read for it are given back, so the float32 weight is
never whole in memory. Anything that needs the whole array (``np.asarray``) still gets it.
"""

from __future__ import annotations

import mmap

import numpy as np
import onnx_ir as ir


class WeightColumns:
    """The float32 weight [K, N] of a 16-bit ``stored`` tensor ([K, N], or [N, K] when
    ``transposed``), widened when indexed.

    ``columns[:, c0:c1]`` (any index) is a float32 copy of that part, after which the pages of
    ``stored``'s memory map are given back (read again from disk if needed); ``np.asarray``
    widens the whole weight. ``shape`` and ``dtype`` are the float32 weight's."""

    def __init__(self, stored: ir.TensorProtocol, transposed: bool):
        self._stored, self._transposed = stored, transposed
        rows, cols = (int(d) for d in stored.shape)
        self.shape = (cols, rows) if transposed else (rows, cols)
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, key) -> np.ndarray:
        narrow = self._stored.numpy()
        part = np.array((narrow.T if self._transposed else narrow)[key], dtype=np.float32)
        del narrow
        if isinstance(self._stored, ir.ExternalTensor):  # its memory map's pages given back
            raw = self._stored.raw
            if isinstance(raw, mmap.mmap) and not raw.closed:
                raw.madvise(mmap.MADV_DONTNEED)
        return part

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[...]
        return whole if dtype is None else whole.astype(dtype, copy=False)
