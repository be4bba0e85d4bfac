"""Activation statistics from calibration runs, and the clip values (amax) observers derive.

One ``TensorStats`` per calibrated tensor, over all rows (tokens) of all calibration windows,
with the last axis as channels:
- ``absmax`` and per-channel ``channel_absmax``: the max observer and SmoothQuant
  (Xiao et al., 2023, eq. 4) need these exactly;
- per-channel mean |x|: AWQ's activation salience (Lin et al., 2024, §3.2);
- a uniform reservoir sample of rows (Vitter's algorithm R): the percentile and MSE observers and
  AWQ's scale search evaluate on it;
- optionally the Gram matrix X^T X over all rows: GPTQ's Hessian (Frantar et al., 2023).

Observers (``--calib-method``), each giving a per-tensor amax, possibly after dividing channel j
by a smoothing factor ``s_j``: ``max`` (largest |x|), ``percentile`` (the 99.99th percentile of
|x|, TensorRT's and ModelOpt's default), ``mse`` (the clip value minimizing the mean squared
quantize-dequantize error on the sample, searched over 0.3..1.0 x max).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llmc.quant.grids import Grid, fake_quant_activation

CALIB_METHODS = ("max", "percentile", "mse")
PERCENTILE = 99.99
_MSE_GRID = np.linspace(0.3, 1.0, 57)


@dataclass
class TensorStats:
    """Statistics of one tensor viewed as rows [*, C] (C channels).

    Attributes:
        channel_absmax: [C] float32, max |x| per channel.
        channel_abssum: [C] float64, sum of |x| per channel over ``rows`` rows.
        rows: rows seen.
        sample: [min(rows, R), C] float32, a uniform sample of the rows.
        gram: [C, C] X^T X over all rows (float64 while collected; float32 once a segment is
            done, as the cache stores it: ``stats_cache.as_stored``), or None when not
            collected.
        factors: GPTQ's factorizations of ``gram`` made so far, by smoothing
            (``llmc.compiler.quantize.rounding``): the formats one module is rounded in, and
            the column chunks of a wide one, factor it once. Not stored.
    """

    channel_absmax: np.ndarray
    channel_abssum: np.ndarray
    rows: int
    sample: np.ndarray
    gram: np.ndarray | None = None
    factors: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def absmax(self) -> float:
        return float(self.channel_absmax.max())

    @property
    def channel_meanabs(self) -> np.ndarray:
        """[C] float32, mean |x| per channel."""
        return (self.channel_abssum / max(self.rows, 1)).astype(np.float32)

    @classmethod
    def empty(cls, channels: int, sample_rows: int, gram: bool = False) -> TensorStats:
        """No rows yet; ``gram``: also accumulate X^T X."""
        return cls(
            np.zeros(channels, np.float32),
            np.zeros(channels, np.float64),
            0,
            np.zeros((0, channels), np.float32),
            np.zeros((channels, channels), np.float64) if gram else None,
        )

    def update(self, x: np.ndarray, rng: np.random.Generator, sample_rows: int) -> None:
        """Add rows ``x`` [..., C] (float32). Raises ValueError on a channel count mismatch."""
        x = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        if x.shape[1] != self.channel_absmax.shape[0]:
            raise ValueError(f"expected {self.channel_absmax.shape[0]} channels, got {x.shape[1]}")
        a = np.abs(x)
        np.maximum(self.channel_absmax, a.max(axis=0), out=self.channel_absmax)
        self.channel_abssum += a.sum(axis=0, dtype=np.float64)
        if self.gram is not None:
            # float32 GEMM per batch of rows (a window), summed in float64 across batches; the
            # ufunc casts as it adds (a float64 copy first took twice the GEMM's time).
            np.add(self.gram, x.T @ x, out=self.gram)
        # Algorithm R, vectorized: row t (0-based, global) replaces slot j ~ U[0, t] if j < R.
        t = self.rows + np.arange(x.shape[0])
        fill = t < sample_rows
        if fill.any():
            self.sample = np.concatenate([self.sample, x[fill]])
        later = ~fill
        if later.any():
            j = rng.integers(0, t[later] + 1)
            keep = j < sample_rows
            self.sample[j[keep]] = x[later][keep]
        self.rows += x.shape[0]


def observe_amax(
    stats: TensorStats, method: str, grid: Grid, smoothing: np.ndarray | None = None
) -> float:
    """The per-tensor clip value of the tensor ``x / smoothing`` (channel-wise) by ``method``
    for quantization on ``grid`` (``llmc.quant.grids``). Raises ValueError on an unknown
    method."""
    inv = 1.0 / smoothing if smoothing is not None else None
    if method == "max":
        absmax = stats.channel_absmax if inv is None else stats.channel_absmax * inv
        return float(absmax.max())
    sample = stats.sample if inv is None else stats.sample * inv[None, :]
    if method == "percentile":
        return float(np.percentile(np.abs(sample), PERCENTILE))
    if method == "mse":
        top = float(np.abs(sample).max())
        errors = [
            float(np.mean((fake_quant_activation(sample, c, grid) - sample) ** 2))
            for c in _MSE_GRID * top
        ]
        return float(_MSE_GRID[int(np.argmin(errors))] * top)
    raise ValueError(f"--calib-method must be one of {', '.join(CALIB_METHODS)}, not {method!r}")
