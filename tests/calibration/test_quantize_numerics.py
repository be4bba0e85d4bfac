"""Quantization numerics: grids, observers, SmoothQuant, AWQ (no graphs, no models)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from llmc.calibration.awq import awq_clip, awq_search
from llmc.calibration.observers import TensorStats, observe_amax
from llmc.calibration.smoothquant import search_alpha, smoothquant_scales
from llmc.quant import grids


def _stats(x: np.ndarray, sample_rows: int = 512, chunk: int = 100) -> TensorStats:
    rng = np.random.default_rng(0)
    s = TensorStats.empty(x.shape[1], sample_rows)
    for i in range(0, len(x), chunk):
        s.update(x[i : i + chunk], rng, sample_rows)
    return s


def test_per_channel_int8_roundtrip_error_is_half_a_step():
    w = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    q = grids.quantize_weight_per_channel(w, grids.INT8)
    assert q.data.dtype == np.int8 and q.axis == 1 and q.scale.shape == (8,)
    assert np.abs(q.data).max() == 127  # each channel's amax maps to the top code
    step = np.abs(w).max(axis=0) / 127
    assert np.all(np.abs(grids.dequantize(q) - w) <= step / 2 + 1e-7)


def test_fp8_weights_use_e4m3_range():
    w = np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32)
    q = grids.quantize_weight_per_channel(w, grids.FP8_E4M3)
    assert q.data.dtype == ml_dtypes.float8_e4m3fn
    assert np.allclose(np.abs(q.data.astype(np.float32)).max(axis=0), 448.0)
    rel = np.abs(grids.dequantize(q) - w) / np.maximum(np.abs(w), 1e-3)
    assert np.median(rel) < 2**-4  # 3 mantissa bits


def test_blockwise_int4_scales_per_block_and_partial_last_block():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((80, 3)).astype(np.float32)
    w[0:32] *= 10  # one block much larger: its scale must not leak into the others
    q = grids.quantize_weight_blockwise(w, grids.INT4, 32)
    assert q.scale.shape == (3, 3) and q.data.dtype == ml_dtypes.int4
    d = grids.dequantize(q)
    for b in range(3):
        rows = slice(32 * b, min(32 * (b + 1), 80))
        step = np.abs(w[rows]).max(axis=0) / 7
        assert np.all(np.abs(d[rows] - w[rows]) <= step / 2 + 1e-6)


def test_reservoir_keeps_every_row_until_full_then_a_uniform_sample():
    x = np.arange(5000, dtype=np.float32)[:, None].repeat(2, axis=1)
    s = _stats(x, sample_rows=1000)
    assert s.rows == 5000 and s.sample.shape == (1000, 2)
    assert s.absmax == 4999 and np.allclose(s.channel_meanabs, 2499.5)
    # a uniform sample of 0..4999 has mean ~2500; keeping the first rows would give ~500
    assert abs(s.sample[:, 0].mean() - 2500) < 250
    assert len(np.unique(s.sample[:, 0])) == 1000


def test_observers_clip_an_outlier_but_max_does_not():
    # 512 sampled rows x 256 channels: the 99.99th percentile is about the 13th largest |x|
    x = np.random.default_rng(3).standard_normal((4000, 256)).astype(np.float32)
    x[:, 3] = np.clip(x[:, 3], -1, 1)
    x[7, 3] = 60.0
    s = _stats(x)
    assert observe_amax(s, "max", grids.INT8) == pytest.approx(60.0)
    # the outlier may or may not be in the sample; both observers must ignore a lone one
    assert observe_amax(s, "percentile", grids.INT8) < 10
    assert observe_amax(s, "mse", grids.INT8) < 0.9 * float(np.abs(s.sample).max()) + 1e-6
    smooth = np.ones(256, np.float32)
    smooth[3] = 10.0
    others = np.abs(np.delete(x, 3, axis=1)).max()
    assert observe_amax(s, "max", grids.INT8, smoothing=smooth) == pytest.approx(max(6.0, others))
    with pytest.raises(ValueError, match="calib-method"):
        observe_amax(s, "entropy", grids.INT8)


def test_smoothquant_balances_activation_and_weight_ranges():
    rng = np.random.default_rng(4)
    act = np.array([100.0, 1.0, 0.01], np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    s = smoothquant_scales(act, w, alpha=0.5)
    w_max = np.abs(w).max(axis=1)
    # alpha 0.5: after smoothing, max|X_j / s_j| == max|W_j * s_j| for every channel
    assert np.allclose(act / s, w_max * s, rtol=1e-5)
    with pytest.raises(ValueError):
        smoothquant_scales(act, w, alpha=1.5)


def test_smoothquant_alpha_search_takes_the_grid_point_of_least_error():
    rng = np.random.default_rng(6)
    act = np.array([50.0, 1.0, 0.5, 0.1], np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    target = smoothquant_scales(act, w, 0.7)
    errors = []

    def error(s):  # distance to alpha 0.7's scales: least at 0.7 itself
        errors.append(float(np.abs(s - target).sum()))
        return errors[-1]

    alpha, s = search_alpha(act, w, [0.0, 0.5, 0.7, 1.0], error)
    assert alpha == 0.7 and np.array_equal(s, target) and len(errors) == 4
    with pytest.raises(ValueError, match="at least one alpha"):
        search_alpha(act, w, [], error)


def test_w8a8_alpha_search_lowers_the_layer_error_against_alpha_one_half():
    """On a layer whose input has one outlier channel, the searched alpha's W8A8 output error
    (the measure on the calibration sample) is at most alpha 0.5's."""
    from llmc.calibration.smoothquant import w8a8_output_error

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2000, 64)).astype(np.float32)
    x[:, 5] *= 80.0
    w = (rng.standard_normal((64, 32)) * 0.05).astype(np.float32)
    stats = _stats(x)
    error = w8a8_output_error(stats, w, calib_method="max", bound_pairs=False)
    grid = [i / 10 for i in range(11)]
    alpha, s = search_alpha(stats.channel_absmax, w, grid, error)
    assert error(s) <= error(smoothquant_scales(stats.channel_absmax, w, 0.5))
    assert error(s) == min(error(smoothquant_scales(stats.channel_absmax, w, a)) for a in grid)


def test_awq_beats_rtn_when_few_input_channels_carry_the_signal():
    rng = np.random.default_rng(5)
    k, n = 256, 64
    x = rng.standard_normal((512, k)).astype(np.float32) * 0.1
    x[:, :4] *= 50  # salient channels, as AWQ observes in LLM activations
    w = rng.standard_normal((k, n)).astype(np.float32)
    res = awq_search(x, np.abs(x).mean(axis=0), w, block_size=128)
    assert res.alpha > 0
    assert res.error < 0.8 * res.error_rtn
    with pytest.raises(ValueError, match="multiple"):
        awq_search(x[:, :100], np.abs(x[:, :100]).mean(axis=0), w[:100], block_size=128)


def test_awq_clip_shrinks_blocks_with_an_outlier_weight():
    rng = np.random.default_rng(6)
    k, n = 128, 16
    x = rng.standard_normal((256, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[5, :8] = 12.0  # one huge weight in half the columns' first block
    clip = awq_clip(x, w, block_size=64)
    full = np.abs(w.reshape(2, 64, n)).max(axis=1)
    assert clip.shape == (2, n) and np.all(clip <= full + 1e-6)
    assert np.all(clip >= 0.5 * full - 1e-6)

    def block_error(amax):
        q = grids.dequantize(grids.quantize_weight_blockwise(w, grids.INT4, 64, amax))
        return float(((x @ (w - q)) ** 2).mean())

    assert block_error(clip) <= block_error(None)


def test_int8_weights_this_host_runs_exactly_on_orts_integer_gemm():
    """ORT fuses W8A8 Q/DQ into MatMulIntegerToFloat; without VNNI its u8 x s8 pair sums
    saturate int16 on plain 8-bit weights, so the build bounds adjacent weight pairs there.
    Whatever this host is, the fused kernel must then agree with the Q/DQ arithmetic in float64."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from llmc.compiler.backends.onnxruntime.host import int8_bound_pairs
    from llmc.engine.isa import detect_host_isa
    from llmc.runtime.runners.ort_env import session_options

    k, n, m = 640, 256, 8
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    x = rng.standard_normal((m, k)).astype(np.float32)
    xs = np.float32(np.abs(x).max() / 127)
    qw = grids.quantize_weight_per_channel(
        w, grids.INT8, int8_bound_pairs(detect_host_isa().features)
    )
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(xs, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.int8), "xz"),
        numpy_helper.from_array(qw.data, "wq"),
        numpy_helper.from_array(qw.scale, "ws"),
        numpy_helper.from_array(np.zeros(n, np.int8), "wz"),
    ]
    graph = helper.make_graph(
        nodes,
        "w8a8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(
        model.SerializeToString(), session_options(2), providers=["CPUExecutionProvider"]
    )
    assert "MatMulIntegerToFloat" in _optimized_ops(model)
    y = session.run(None, {"x": x})[0]
    xq = np.clip(np.rint(x / xs), -127, 127).astype(np.float64)
    exact = (xq * xs) @ (qw.data.astype(np.float64) * qw.scale)
    assert np.abs(y - exact).max() / np.abs(exact).max() < 1e-5


def _optimized_ops(model) -> set[str]:
    import tempfile

    import onnx
    import onnxruntime as ort

    from llmc.runtime.runners.ort_env import session_options

    with tempfile.TemporaryDirectory() as d:
        opts = session_options(2)
        opts.optimized_model_filepath = f"{d}/opt.onnx"
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return {node.op_type for node in onnx.load(f"{d}/opt.onnx").graph.node}


@pytest.mark.parametrize("k", [64, 65])
def test_bound_pairs_keeps_every_adjacent_pair_within_128(k):
    rng = np.random.default_rng(k)
    w = (rng.standard_t(2, (k, 32)) * 0.05).astype(np.float32)
    w[10, 3], w[11, 3] = 1.0, -1.0  # a pair of two maxima: plain 8-bit gives |q| sum 254
    plain = grids.quantize_weight_per_channel(w, grids.INT8)
    bounded = grids.quantize_weight_per_channel(w, grids.INT8, bound_pairs=True)

    def pair_sums(q: np.ndarray) -> np.ndarray:
        a = np.abs(q.astype(np.int32))
        a = np.concatenate([a, np.zeros((a.shape[0] % 2, a.shape[1]), np.int32)])
        return a[0::2] + a[1::2]

    assert pair_sums(plain.data).max() == 254
    assert pair_sums(bounded.data).max() <= 128
    assert np.abs(bounded.data).max() <= 127
    err = np.abs(bounded.data * bounded.scale - w).max(axis=0)
    assert np.all(err <= bounded.scale / 2 + 1e-7)  # still round-to-nearest on its own grid


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_weight_only8_in_column_chunks_equals_one_pass(monkeypatch, rounding):
    """A wide weight is quantized COLUMNS output channels at a time: same codes and scales as
    one pass over the whole weight (GPTQ's updates and the blocks run along K only)."""
    from llmc.compiler.quantize.formats import int8_weight_only as fmt
    from llmc.quant.protocol import QuantSpec

    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    stats = _stats(x)
    stats.gram = (x.T @ x).astype(np.float64)
    spec = QuantSpec(quant="int4", int4_block_size=32, weight_rounding=rounding)
    whole = fmt.FORMAT.quantize(w.T.copy().T, stats, spec)  # a non-contiguous view, as a tied
    monkeypatch.setattr(fmt, "COLUMNS", 16)  # projection's transposed table is passed
    chunked = fmt.FORMAT.quantize(w, stats, spec)
    assert chunked.record["rounding"] == rounding
    assert whole.weight.data.shape == (64, 40) and whole.weight.scale.shape == (2, 40)
    np.testing.assert_array_equal(chunked.weight.data, whole.weight.data)
    np.testing.assert_array_equal(chunked.weight.scale, whole.weight.scale)
