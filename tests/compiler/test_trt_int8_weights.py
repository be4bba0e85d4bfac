"""Block-wise INT8 weights re-gridded per channel for TensorRT (whose block dequantization takes
FP4, FP8 and INT4 only): the layout TensorRT accepts, each weight within half a step."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.quantize.formats.int8_weights import blockwise_int8_to_per_channel


def _graph(q: np.ndarray, block_scale: np.ndarray, block: int) -> onnx.ModelProto:
    """x [1, K] @ DQ(q [K, N] int8, block-wise along K) -> y."""
    k, n = q.shape
    dq = helper.make_node(
        "DequantizeLinear",
        ["w", "w_scale"],
        ["w_dq"],
        "lm_head/weight_DQ",
        axis=0,
        block_size=block,
    )
    mm = helper.make_node("MatMul", ["x", "w_dq"], ["y"], "lm_head/MatMul")
    graph = helper.make_graph(
        [dq, mm],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(q, "w"), numpy_helper.from_array(block_scale, "w_scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _weight(model: onnx.ModelProto) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer}
    dq = model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
    q, s = inits["w"], inits["w_scale"]
    if attrs.get("block_size"):
        return q * np.repeat(s, attrs["block_size"], axis=0)[: q.shape[0]]
    return q * s[None, :]


def test_block_wise_int8_becomes_per_channel_within_half_a_step():
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (200, 32)).astype(np.int8)  # 4 blocks of 64, the last short
    model = _graph(q, rng.uniform(0.001, 0.05, (4, 32)).astype(np.float32), 64)
    before = _weight(model)
    assert blockwise_int8_to_per_channel(model) == 1
    dq = model.graph.node[0]
    assert [(a.name, helper.get_attribute_value(a)) for a in dq.attribute] == [("axis", 1)]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w"].dtype == np.int8 and np.abs(inits["w"]).max() <= 127
    scale = inits["w_scale"]
    assert scale.shape == (32,) and scale.dtype == np.float32
    np.testing.assert_allclose(scale, np.abs(before).max(axis=0) / 127, rtol=1e-6)
    error = np.abs(_weight(model) - before)
    assert np.all(error <= scale[None, :] / 2 * (1 + 1e-6)) and error.max() > 0
    onnx.checker.check_model(model, full_check=True)


def test_one_block_is_exact_and_other_weights_are_left_alone():
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (64, 8)).astype(np.int8)
    q[5] = 127  # as quantized: each block's largest weight is on the grid's end (amax / 127)
    model = _graph(q, rng.uniform(0.01, 0.02, (1, 8)).astype(np.float32), 64)
    before = _weight(model)
    assert blockwise_int8_to_per_channel(model) == 1
    np.testing.assert_allclose(_weight(model), before, rtol=1e-6, atol=0)
    int4 = _graph(q, np.ones((1, 8), np.float32), 64)
    int4.graph.initializer[0].data_type = TensorProto.INT4  # not INT8: TensorRT blocks it
    assert blockwise_int8_to_per_channel(int4) == 0
