"""GPTQ: weight rounding that compensates each rounding error with the columns not yet rounded.

Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers" (ICLR 2023), Algorithm 1. For ``Y = X W`` the layer-wise objective
``||X W - X Q||^2`` has the Hessian ``H = X^T X`` over the input channels. Input channels are
quantized one at a time (in descending ``diag(H)`` order, the paper's "act-order"); the error of
each is spread over the remaining channels through the upper Cholesky factor of ``H^-1``, in
lazy blocks of 128 channels. The grid is given: every channel is rounded with scales fixed
beforehand (per output channel, or per block of input channels), so the result drops into the
same Q/DQ nodes as round-to-nearest, for any format (INT8, FP8 E4M3, INT4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

DAMPING = 0.01  # fraction of mean(diag(H)) added to the diagonal (the paper's lambda)
BLOCK = 128  # input channels per lazy batch update
ROWS = 16384  # output channels rounded at a time (they are independent): bounds memory

# rounder(w, rows, idx): w [len(rows), m] (output channels ``rows``, input channels ``idx`` [m]
# int64, as columns) rounded to nearest on the fixed grid, float32.
Rounder = Callable[[torch.Tensor, slice, torch.Tensor], torch.Tensor]


@torch.no_grad()
def gptq_round(
    weight: np.ndarray,
    hessian: np.ndarray,
    rounder: Rounder,
    smoothing: np.ndarray | None = None,
) -> np.ndarray:
    """GPTQ-rounded ``weight`` [K, N] float32 (MatMul's B: K input channels): every entry a value
    of the grid ``rounder`` rounds to, chosen to minimize ``||X W - X Q||^2`` for inputs X with
    ``hessian`` = X^T X [K, K] (float32/64, positive semi-definite), or, with ``smoothing`` s [K]
    (positive), for the inputs X / s (channel-wise): the Hessian H / (s s^T), formed on the
    factorization's own copy of H.

    Channels that never see input (``H[j, j] == 0``) are rounded to nearest. Output channels are
    independent, so they are processed ``ROWS`` at a time with one factorization
    (``gptq_round_chunks``). Raises ValueError on mismatched shapes.
    """
    out = np.empty(weight.shape, np.float32)
    for rows, q in gptq_round_chunks(weight, hessian, rounder, smoothing):
        out[:, rows] = q
    return out


@torch.no_grad()
def gptq_round_chunks(
    weight: np.ndarray,
    hessian: np.ndarray,
    rounder: Rounder,
    smoothing: np.ndarray | None = None,
    factor: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Iterator[tuple[slice, np.ndarray]]:
    """``gptq_round`` one chunk of output channels at a time: yields (``rows``, the rounded
    ``weight[:, rows]`` [K, len(rows)] float32) for consecutive slices of at most ``ROWS``.
    Only one chunk's copies are alive at a time (``weight`` is read, not copied whole: a
    128256 x 3072 vocabulary projection is 1.6 GB in float32). ``factor``: ``act_order_factor``
    of (``hessian``, ``smoothing``) when the caller made it already. Raises ValueError on
    mismatched shapes."""
    k, n = weight.shape
    if hessian.shape != (k, k):
        raise ValueError(f"Hessian {hessian.shape} does not match weight {weight.shape}")
    order, u = factor if factor is not None else act_order_factor(hessian, smoothing)
    index = order.numpy()
    for r1 in range(0, n, ROWS):
        rows = slice(r1, min(r1 + ROWS, n))
        # [rows, K] in act-order: a copy (ONNX arrays are read-only)
        w = torch.from_numpy(np.ascontiguousarray(weight[index, rows].T, np.float32))
        q = _round_rows(w, u, order, rows, rounder)
        chunk = np.empty((k, rows.stop - rows.start), np.float32)
        chunk[index] = q.T.numpy()
        del w, q  # not held while the caller uses the chunk
        yield rows, chunk


def act_order_factor(
    hessian: np.ndarray, smoothing: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, U): the input channels in descending ``diag(H)`` order ([K] int64; dead channels
    get ``H[j, j] = 1``), and the upper Cholesky factor U [K, K] float32 of the inverse of the
    damped H in that order (U^T U = H_d^-1, ``H_d = H[order][:, order] + DAMPING * mean(diag H)
    * I``), computed in float64. H is ``hessian``, or with ``smoothing`` s, ``hessian / (s
    s^T)``. ``hessian`` is read, not changed.

    With J the order-reversing permutation and J H_d J = M M^T (M lower), H_d^-1 = (M^-1 J)^T
    (M^-1 J), so U = J M^-1 J: one Cholesky and one triangular solve, where factoring H_d,
    inverting it and factoring the inverse (the paper's reference code) took 1.8x the time for
    K = 4,864 on 2 cores. Two [K, K] float64 buffers besides ``hessian`` are live at most: the
    permuted copy of H, factored in place into M, and the identity solved in place into
    M^-1 (8,192 input channels: 1.07 GB, then U in float32).
    """
    hess = np.asarray(hessian)
    inv = None if smoothing is None else 1.0 / np.asarray(smoothing, np.float64)
    diag = np.diagonal(hess).astype(np.float64)  # a copy
    if inv is not None:
        diag = diag * inv * inv
    dead = diag <= 0
    diag[dead] = 1.0
    order = torch.argsort(torch.from_numpy(diag), descending=True)
    reverse = order.flip(0).numpy()
    # J H[order][:, order] J, gathered in one copy and smoothed in place
    h = np.asarray(hess[np.ix_(reverse, reverse)], np.float64)
    if inv is not None:
        h *= inv[reverse, None]
        h *= inv[None, reverse]
    h = torch.from_numpy(h)
    h.diagonal()[torch.from_numpy(dead[reverse])] = 1.0
    h.diagonal().add_(DAMPING * torch.diagonal(h).mean())
    torch.linalg.cholesky(h, out=h)  # M, in place
    m_inv = torch.eye(h.shape[0], dtype=torch.float64)
    torch.linalg.solve_triangular(h, m_inv, upper=False, out=m_inv)  # M^-1, in place
    del h
    u = np.ascontiguousarray(m_inv.numpy()[::-1, ::-1], dtype=np.float32)  # J M^-1 J
    return order, torch.from_numpy(u)


def _round_rows(w: torch.Tensor, u: torch.Tensor, order: torch.Tensor, rows: slice, rounder):
    """Algorithm 1 of the paper on ``w`` [R, K] (columns in act-order); returns Q [R, K]."""
    k = w.shape[1]
    q = torch.empty_like(w)
    for i1 in range(0, k, BLOCK):
        i2 = min(i1 + BLOCK, k)
        w1 = w[:, i1:i2].clone()
        err = torch.empty_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            qi = rounder(w1[:, i : i + 1], rows, order[i1 + i : i1 + i + 1])[:, 0]
            q[:, i1 + i] = qi
            e = (w1[:, i] - qi) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    return q
