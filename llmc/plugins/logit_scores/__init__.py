"""The accuracy report's per-row sums over two logits matrices (``logit_scores.c``): NLL of the
next token under each, KL divergence, argmax agreement. Part of the CPU kernel library
(``paged_attention.cpu.load_library``), on its thread pool."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from llmc.plugins.paged_attention.cpu import load_library


@functools.cache
def _row_sums_fn(library: Path):
    function = ctypes.CDLL(str(library)).llmc_logit_row_sums
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    function.restype = None
    function.argtypes = [ptr, ptr, ptr, i64, i64, ptr]
    return function


def logit_row_sums(
    reference: np.ndarray,
    candidate: np.ndarray,
    targets: np.ndarray,
    library: Path | None = None,
) -> np.ndarray:
    """Per row of ``reference`` and ``candidate`` ([N, V] float32 logits) and ``targets`` ([N]
    int64, the token each row predicts): [N, 4] float64 of (lse(reference) - reference[t],
    lse(candidate) - candidate[t], KL(softmax(reference) || softmax(candidate)), 1.0 where their
    first argmaxes agree). KL keeps its relative precision at per-row values of 1e-6 (the
    centred form in ``logit_scores.c``); a reference logit of -inf counts as probability 0.
    ``library``: a build holding ``llmc_logit_row_sums`` (default: the kernel library; the
    tests pass builds for other ISAs).

    Raises ValueError for shapes that differ or targets outside [0, V); RuntimeError as
    ``load_library``."""
    x = np.ascontiguousarray(reference, np.float32)
    y = np.ascontiguousarray(candidate, np.float32)
    t = np.ascontiguousarray(targets, np.int64)
    if x.ndim != 2 or x.shape != y.shape or t.shape != (x.shape[0],):
        raise ValueError(f"logits {x.shape} and {y.shape} with targets {t.shape}")
    if t.size and (t.min() < 0 or t.max() >= x.shape[1]):
        raise ValueError(f"targets outside [0, {x.shape[1]})")
    out = np.empty((x.shape[0], 4), np.float64)
    if x.shape[0]:
        function = _row_sums_fn(library or load_library().path)
        function(x.ctypes.data, y.ctypes.data, t.ctypes.data, *x.shape, out.ctypes.data)
    return out
