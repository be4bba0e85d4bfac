"""passes/head_layout.py: q/k's Transpose pair around RMSNorm and RoPE is dropped, and only
for a head/token swap; checked by running both graphs in ONNX Runtime (same values bit for bit)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.passes.head_layout import keep_heads_token_major
from llmc.runtime.runners.ort_env import session_options

HEADS, HEAD_SIZE = 4, 8


def rope_model(with_norm: bool, perm: list[int], interleaved: int) -> onnx.ModelProto:
    """x [1, S, H, D] -> Transpose(perm) -> [RMSNormalization] -> RotaryEmbedding -> Transpose."""
    nodes = [helper.make_node("Transpose", ["x"], ["swapped"], perm=perm)]
    rope_input = "swapped"
    if with_norm:
        nodes.append(
            helper.make_node("RMSNormalization", ["swapped", "w"], ["normed"], epsilon=1e-6)
        )
        rope_input = "normed"
    nodes += [
        helper.make_node(
            "RotaryEmbedding",
            [rope_input, "cos", "sin"],
            ["rotated"],
            interleaved=interleaved,
            num_heads=HEADS,
        ),
        helper.make_node("Transpose", ["rotated"], ["y"], perm=perm),
    ]
    half = [1, "S", HEAD_SIZE // 2]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", HEADS, HEAD_SIZE]),
            helper.make_tensor_value_info("cos", TensorProto.FLOAT, half),
            helper.make_tensor_value_info("sin", TensorProto.FLOAT, half),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.linspace(0.5, 1.5, HEAD_SIZE, dtype="f4"), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = session_options(2)  # the process's global pool, as every llmc session
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session.run(["y"], feeds)[0]


def rewrite(model: onnx.ModelProto) -> tuple[int, onnx.ModelProto]:
    ir_model = ir.from_proto(model)
    count = keep_heads_token_major(ir_model)
    return count, ir.to_proto(ir_model)


@pytest.mark.parametrize("with_norm", [True, False], ids=["gemma-qk-norm", "llama"])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_head_swaps_around_norm_and_rope_are_dropped(with_norm: bool, interleaved: int) -> None:
    model = rope_model(with_norm, [0, 2, 1, 3], interleaved)
    count, rewritten = rewrite(model)
    ops = [n.op_type for n in rewritten.graph.node]
    assert count == 1
    assert "Transpose" not in ops
    rope = next(n for n in rewritten.graph.node if n.op_type == "RotaryEmbedding")
    attributes = {a.name: helper.get_attribute_value(a) for a in rope.attribute}
    assert attributes == {"interleaved": interleaved, "num_heads": HEADS}
    rng = np.random.default_rng(0)
    seq = 5
    angles = rng.uniform(0, 3, [1, seq, HEAD_SIZE // 2]).astype(np.float32)
    feeds = {
        "x": rng.standard_normal([1, seq, HEADS, HEAD_SIZE]).astype(np.float32),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
    }
    np.testing.assert_array_equal(run(rewritten, feeds), run(model, feeds))


def test_other_permutations_are_left_alone() -> None:
    """A Transpose that does not swap heads and tokens is not the exporter's head layout."""
    model = rope_model(True, [0, 1, 2, 3], 0)
    count, rewritten = rewrite(model)
    assert count == 0
    assert [n.op_type for n in rewritten.graph.node].count("Transpose") == 2
