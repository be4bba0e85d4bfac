"""skip_norm.py: a residual Add and the RMSNormalization of its sum become one
SkipSimplifiedLayerNormalization, and only then; other norms become SimplifiedLayerNormalization.
Checked by running both graphs in ONNX Runtime (the same values to float32 rounding, the sum
still reaching its other consumers)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.onnxruntime.rewrites.skip_norm import (
    FUSED_OP,
    PLAIN_OP,
    fuse_skip_rms_norm,
    use_simplified_layer_norm,
)
from llmc.runtime.runners.ort_env import session_options

HIDDEN = 16


def residual_model(addend: str, axis: int, second_norm: bool) -> onnx.ModelProto:
    """h = residual + addend; y = RMSNorm(h); z = h * y (h used again, as the residual stream)."""
    nodes = [
        helper.make_node("Add", ["residual", addend], ["h"]),
        helper.make_node("RMSNormalization", ["h", "w"], ["y"], axis=axis, epsilon=1e-6),
        helper.make_node("Mul", ["h", "y"], ["z"]),
    ]
    if second_norm:
        nodes.append(helper.make_node("RMSNormalization", ["h", "w"], ["y2"], epsilon=1e-6))
        nodes.append(helper.make_node("Add", ["z", "y2"], ["z2"]))
    shape = [1, "T", HIDDEN]
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("residual", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
        ],
        [helper.make_tensor_value_info("z2" if second_norm else "z", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(
        model.SerializeToString(), session_options(2), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal([1, 5, HIDDEN]).astype(np.float32) for n in ("residual", "x")}


def test_residual_add_and_its_norm_become_one_node() -> None:
    model = residual_model("x", -1, second_norm=False)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_skip_rms_norm(fused) == 1
    assert [n.op_type for n in fused.graph.node] == [FUSED_OP, "Mul"]
    np.testing.assert_allclose(run(fused, feeds()), run(model, feeds()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("addend", "axis", "second_norm"),
    [
        ("bias", -1, False),  # a bias Add, not a residual stream
        ("x", 1, False),  # normalizes another axis
        ("x", -1, True),  # two norms of one sum: which one would the fused node replace?
    ],
    ids=["bias", "other-axis", "two-norms"],
)
def test_other_adds_and_norms_are_left_alone(addend: str, axis: int, second_norm: bool) -> None:
    model = residual_model(addend, axis, second_norm)
    before = [n.op_type for n in model.graph.node]
    assert fuse_skip_rms_norm(model) == 0
    assert [n.op_type for n in model.graph.node] == before


def norm_model(axis: int, stash_type: int) -> onnx.ModelProto:
    """y = RMSNorm(x) over axes [axis, rank) of x [2, T, 3, HIDDEN], then y * 2."""
    rng = np.random.default_rng(2)
    scale_shape = [HIDDEN] if axis == -1 else [3, HIDDEN]
    graph = helper.make_graph(
        [
            helper.make_node(
                "RMSNormalization",
                ["x", "w"],
                ["y"],
                axis=axis,
                epsilon=1e-3,
                stash_type=stash_type,
            ),
            helper.make_node("Add", ["y", "y"], ["z"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "T", 3, HIDDEN])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(rng.uniform(0.5, 1.5, scale_shape).astype(np.float32), "w")
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("axis", [-1, 2])
def test_other_norms_run_on_simplified_layer_normalization(axis: int) -> None:
    model = norm_model(axis, stash_type=1)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert use_simplified_layer_norm(rewritten) == 1
    assert [n.op_type for n in rewritten.graph.node] == [PLAIN_OP, "Add"]
    x = {"x": np.random.default_rng(3).standard_normal([2, 7, 3, HIDDEN]).astype(np.float32) * 5}
    expected = run(model, x)
    rms = np.sqrt(np.mean(np.square(x["x"]), axis=tuple(range(axis % 4, 4)), keepdims=True))
    w = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(expected, 2 * x["x"] / np.sqrt(rms**2 + 1e-3) * w, rtol=1e-5)
    np.testing.assert_allclose(run(rewritten, x), expected, rtol=1e-6, atol=1e-6)


def test_a_norm_stashed_in_another_precision_is_left_alone() -> None:
    model = norm_model(-1, stash_type=0)
    assert use_simplified_layer_norm(model) == 0
    assert model.graph.node[0].op_type == "RMSNormalization"
