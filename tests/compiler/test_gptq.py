"""GPTQ rounding (llmc.calibration.gptq, llmc.compiler.quantize.rounding) on random layers:
the grid and scales are kept, the layer's output error is lower than round-to-nearest's, and
uncorrelated inputs give round-to-nearest exactly."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from llmc.calibration import gptq
from llmc.compiler.quantize.rounding import gptq_on_grid
from llmc.quant import grids

K, N, ROWS = 64, 48, 512


def correlated_inputs(rng: np.random.Generator) -> np.ndarray:
    """[ROWS, K] activations with correlated channels and a few large ones, as in LLM layers."""
    x = rng.standard_normal((ROWS, K)) @ rng.standard_normal((K, K)) * 0.3
    x[:, :4] *= 8.0
    return x.astype(np.float32)


def rtn(w: np.ndarray, kind: str) -> grids.QuantizedWeight:
    if kind == "int4":
        return grids.quantize_weight_blockwise(w, grids.INT4, 16)
    if kind == "int8_blockwise":
        return grids.quantize_weight_blockwise(w, grids.INT8, 32)
    return grids.quantize_weight_per_channel(w, {"int8": grids.INT8, "fp8": grids.FP8_E4M3}[kind])


def output_error(x: np.ndarray, w: np.ndarray, qw: grids.QuantizedWeight) -> float:
    return float(np.sum((x @ w - x @ grids.dequantize(qw)) ** 2))


@pytest.mark.parametrize("kind", ["int8", "fp8", "int4", "int8_blockwise"])
def test_gptq_keeps_the_grid_and_lowers_the_output_error(kind):
    rng = np.random.default_rng(0)
    x = correlated_inputs(rng)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    near = rtn(w, kind)
    out = gptq_on_grid(w, near, x.T.astype(np.float64) @ x)
    assert out.data.dtype == near.data.dtype and out.data.shape == near.data.shape
    np.testing.assert_array_equal(out.scale, near.scale)
    assert (out.axis, out.block_size) == (near.axis, near.block_size)
    assert not np.array_equal(out.data, near.data)
    if kind == "fp8":  # every code a finite E4M3 value
        assert np.isfinite(out.data.astype(np.float32)).all()
    else:
        lo = -8 if kind == "int4" else -127
        codes = out.data.astype(np.int32)
        assert codes.min() >= lo and codes.max() <= (7 if kind == "int4" else 127)
    # GPTQ's objective is this error; it should fall well below round-to-nearest's.
    assert output_error(x, w, out) < 0.8 * output_error(x, w, near)


def test_uncorrelated_inputs_give_round_to_nearest():
    """With a diagonal Hessian no rounding error can be compensated: GPTQ is RTN exactly."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((K, N)).astype(np.float32)
    hessian = np.diag(rng.uniform(0.5, 2.0, K))
    near = grids.quantize_weight_per_channel(w, grids.INT8)
    np.testing.assert_array_equal(gptq_on_grid(w, near, hessian).data, near.data)


def test_channels_without_input_are_rounded_to_nearest_and_nothing_is_nan():
    rng = np.random.default_rng(2)
    x = correlated_inputs(rng)
    x[:, 5] = 0.0  # a dead input channel: H[5, 5] == 0
    w = rng.standard_normal((K, N)).astype(np.float32)
    near = grids.quantize_weight_blockwise(w, grids.INT4, 16)
    out = gptq_on_grid(w, near, x.T.astype(np.float64) @ x)
    assert np.isfinite(grids.dequantize(out)).all()
    assert output_error(x, w, out) < output_error(x, w, near)


@pytest.mark.parametrize("kind", ["fp8", "int4", "int8_blockwise"])
def test_output_channels_in_chunks_give_the_same_codes(monkeypatch, kind):
    # Chunks of 7 output channels (per-channel scales [N] and block-wise [K / block, N] sliced
    # per chunk) give the codes of one chunk of all 48, which GPTQ computes in one pass.
    rng = np.random.default_rng(3)
    x = correlated_inputs(rng)
    w = rng.standard_normal((K, N)).astype(np.float32)
    near = rtn(w, kind)
    hessian = x.T.astype(np.float64) @ x
    whole = gptq_on_grid(w, near, hessian)
    monkeypatch.setattr(gptq, "ROWS", 7)
    chunked = gptq_on_grid(w, near, hessian)
    if kind == "fp8":
        assert whole.data.dtype == ml_dtypes.float8_e4m3fn
    assert not np.array_equal(whole.data, near.data)  # GPTQ moved some codes
    np.testing.assert_array_equal(whole.data.view(np.uint8), chunked.data.view(np.uint8))


@pytest.mark.parametrize("block_size", [0, 16, 24])
def test_codes_converted_in_slices_of_input_channels_are_the_same(monkeypatch, block_size):
    # Codes made 5 input channels at a time (slices that cross blocks of 16 and 24, the last
    # block of 24 shorter: K = 64) equal those made in one piece, and dequantize to values on
    # the grid GPTQ rounded to (below RTN's output error).
    from llmc.compiler.quantize import rounding

    rng = np.random.default_rng(4)
    x = correlated_inputs(rng)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    if block_size:
        near = grids.quantize_weight_blockwise(w, grids.INT4, block_size)
    else:
        near = grids.quantize_weight_per_channel(w, grids.INT8)
    hessian = x.T.astype(np.float64) @ x
    whole = gptq_on_grid(w, near, hessian)
    monkeypatch.setattr(rounding, "CODE_ROWS", 5)
    sliced = gptq_on_grid(w, near, hessian)
    np.testing.assert_array_equal(whole.data.view(np.int8), sliced.data.view(np.int8))
    assert output_error(x, w, sliced) < 0.8 * output_error(x, w, near)


def test_smoothing_factors_the_gram_of_the_smoothed_inputs():
    rng = np.random.default_rng(4)
    x = correlated_inputs(rng).astype(np.float64)
    s = rng.uniform(0.5, 3.0, K)
    gram = x.T @ x
    gram[3, :] = gram[:, 3] = 0.0  # a channel that never sees input
    smoothed = (x / s) * (np.arange(K) != 3)
    order, u = gptq.act_order_factor(gram, s)
    want_order, want_u = gptq.act_order_factor(smoothed.T @ smoothed)
    assert order.tolist() == want_order.tolist()
    np.testing.assert_allclose(u.numpy(), want_u.numpy(), rtol=1e-5, atol=1e-6)
    assert gram[3, 3] == 0.0  # read, not changed


def test_mismatched_hessian_is_refused():
    w = np.zeros((K, N), np.float32)
    with pytest.raises(ValueError, match="Hessian"):
        gptq.gptq_round(w, np.eye(K + 1), lambda v, rows, idx: v)


@pytest.mark.parametrize("k", [1, 7, 300])
def test_act_order_factor_is_the_factor_of_the_damped_inverse(k):
    import torch

    rng = np.random.default_rng(k)
    x = rng.standard_normal((2 * k + 3, k)) * rng.uniform(0.1, 3.0, k)
    hessian = x.T @ x
    if k > 1:
        hessian[0, :] = hessian[:, 0] = 0.0  # a channel that never sees input
    order, u = gptq.act_order_factor(hessian)
    diag = np.diagonal(hessian).copy()
    diag[diag <= 0] = 1.0
    assert sorted(order.tolist()) == list(range(k))  # a permutation, by descending diag(H)
    assert np.all(np.diff(diag[order.numpy()]) <= 0)
    h = torch.from_numpy(hessian.copy())
    h[0, 0] = diag[0]
    ordered = h[order][:, order]
    ordered += gptq.DAMPING * torch.diagonal(ordered).mean() * torch.eye(k, dtype=torch.float64)
    assert u.dtype == torch.float32 and torch.equal(u, torch.triu(u))
    # the factor the GPTQ paper's code takes: factor H, invert, factor the inverse (upper)
    paper = torch.linalg.cholesky(
        torch.cholesky_inverse(torch.linalg.cholesky(ordered)), upper=True
    )
    torch.testing.assert_close(u, paper.float(), rtol=1e-5, atol=1e-6)


def test_one_statistics_object_is_factored_once_for_every_rounding_of_its_input(monkeypatch):
    """Rounding two formats, and a second module reading the same input, with one
    ``TensorStats`` factors its Gram matrix once (per smoothing), with the codes each rounding
    gives on its own."""
    from llmc.calibration.observers import TensorStats
    from llmc.compiler.quantize import rounding
    from llmc.quant.protocol import QuantSpec

    rng = np.random.default_rng(5)
    x = correlated_inputs(rng)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    gram = x.T.astype(np.float64) @ x
    stats = TensorStats(np.abs(x).max(0), np.abs(x).sum(0), ROWS, x[:8], gram)
    spec = QuantSpec(quant="fp8", weight_rounding="gptq")
    made = []
    real = gptq.act_order_factor
    monkeypatch.setattr(gptq, "act_order_factor", lambda *a: made.append(1) or real(*a))
    smoothing = np.linspace(0.5, 2.0, K).astype(np.float32)
    for kind in ("fp8", "int8_blockwise", "int4"):
        got, how = rounding.rounded(rtn(w, kind), w, stats, None, spec)
        alone = gptq_on_grid(w, rtn(w, kind), gram)
        assert how == "gptq" and np.array_equal(got.data, alone.data)
    assert len(made) == 3 + 1  # the three lone roundings, and one for the statistics
    smoothed, _ = rounding.rounded(rtn(w, "int8"), w, stats, smoothing, spec)
    assert np.array_equal(smoothed.data, gptq_on_grid(w, rtn(w, "int8"), gram, smoothing).data)
    assert len(made) == 4 + 2 and len(stats.factors) == 2  # one more for the smoothed inputs
