"""passes/no_op.py: a Gather of index 0 on an axis of size 1 becomes a Squeeze, and only then;
checked by running both graphs in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.passes.no_op import remove_no_ops
from llmc.runtime.runners.ort_env import session_options


def gather_model(x_shape: list, index: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node("Gather", ["x", "index"], ["y"], axis=0)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(index, "index")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = session_options(2)  # the process's global pool, as every llmc session
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session.run(["y"], {"x": x})[0]


@pytest.mark.parametrize(
    ("x_shape", "index", "rewritten"),
    [
        ([1, "S", 8], np.array(0, np.int64), True),  # logits[0] of a batch of one
        ([2, "S", 8], np.array(0, np.int64), False),  # a real select
        ([1, "S", 8], np.array([0], np.int64), False),  # a [1] index keeps the axis
        ([1, "S", 8], np.array(-1, np.int64), False),  # not recognised: left alone
    ],
)
def test_select_of_a_size_one_axis_becomes_a_squeeze(x_shape, index, rewritten: bool) -> None:
    model = gather_model(x_shape, index)
    graph = ir.from_proto(model)

    count = remove_no_ops(graph)

    rewritten_model = ir.to_proto(graph)
    ops = [n.op_type for n in rewritten_model.graph.node]
    assert (count, "Squeeze" in ops, "Gather" in ops) == (int(rewritten), rewritten, not rewritten)
    x = np.random.default_rng(0).standard_normal([x_shape[0], 3, 8]).astype(np.float32)
    np.testing.assert_array_equal(run(rewritten_model, x), run(model, x))


@pytest.mark.parametrize("tied", [False, True])
def test_select_of_a_matmul_moves_onto_its_input(tied: bool) -> None:
    """logits[0] of lm_head(hidden [1, S, D]): the MatMul then writes [S, V] itself. Tied: the
    weight is a Transpose of the embedding, with no shape recorded, as the exporter writes it."""
    w = np.random.default_rng(1).standard_normal([4, 8]).astype(np.float32)
    if tied:
        w = w.T.copy()
    nodes = [
        *([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])] if tied else []),
        helper.make_node("MatMul", ["x", "wt" if tied else "w"], ["xw"]),
        helper.make_node("Gather", ["xw", "index"], ["y"], axis=0),
    ]
    scopes = nodes[-2].metadata_props.add()  # the module name quantization matches
    scopes.key, scopes.value = "pkg.torch.onnx.name_scopes", "['', 'model.lm_head']"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(0, np.int64), "index"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    ir_model = ir.from_proto(model)

    assert remove_no_ops(ir_model) == 1

    rewritten = ir.to_proto(ir_model)
    ops = [n.op_type for n in rewritten.graph.node if n.op_type not in ("Constant", "Transpose")]
    assert ops == ["Squeeze", "MatMul"]
    (matmul,) = [n for n in rewritten.graph.node if n.op_type == "MatMul"]
    assert [(e.key, e.value) for e in matmul.metadata_props] == [(scopes.key, scopes.value)]
    assert [o.name for o in rewritten.graph.output] == ["y"]
    x = np.random.default_rng(0).standard_normal([1, 3, 4]).astype(np.float32)
    np.testing.assert_array_equal(run(rewritten, x), run(model, x))
