"""Quantized weights spilled to disk read back as the same tensors, 4-bit codes packed two to a
byte, and a graph holding them saves with its weights intact."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from llmc.compiler.quantize.tensor_spill import TensorSpill


def test_large_arrays_spill_and_read_back_packed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, size=(256, 96)).astype(ml_dtypes.int4)
    weights = rng.integers(-128, 128, size=(128, 64)).astype(np.int8)
    scale = rng.random((2, 96), dtype=np.float32)
    with TensorSpill(tmp_path / "q.spill", threshold=4096) as spill:
        t_codes = spill.tensor(codes, "codes")
        t_weights = spill.tensor(weights, "weights")
        t_scale = spill.tensor(scale, "scale")
    assert isinstance(t_codes, ir.ExternalTensor) and isinstance(t_weights, ir.ExternalTensor)
    assert not isinstance(t_scale, ir.ExternalTensor)  # 768 bytes: below the threshold
    assert t_codes.dtype == ir.DataType.INT4 and t_weights.dtype == ir.DataType.INT8
    # 256 x 96 codes in 12,288 bytes (two per byte), then 8,192 int8 bytes
    assert (tmp_path / "q.spill").stat().st_size == 256 * 96 // 2 + 128 * 64
    np.testing.assert_array_equal(t_codes.numpy().astype(np.int8), codes.astype(np.int8))
    np.testing.assert_array_equal(t_weights.numpy(), weights)
    np.testing.assert_array_equal(t_scale.numpy(), scale)


def test_a_graph_of_spilled_weights_saves_them_into_its_external_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    codes = rng.integers(-8, 8, size=(128, 64)).astype(ml_dtypes.int4)
    scale = rng.random((4, 64), dtype=np.float32)
    x = ir.Value(name="x", shape=ir.Shape([1, 128]), type=ir.TensorType(ir.DataType.FLOAT))
    with TensorSpill(tmp_path / "q.spill", threshold=1024) as spill:
        w = ir.Value(name="w", const_value=spill.tensor(codes, "w"))
        s = ir.Value(name="s", const_value=spill.tensor(scale, "s"))
    dq = ir.node("DequantizeLinear", [w, s], {"axis": 0, "block_size": 32})
    mm = ir.node("MatMul", [x, dq.outputs[0]])
    mm.outputs[0].name = "y"
    graph = ir.Graph(
        [x], [mm.outputs[0]], nodes=[dq, mm], initializers=[w, s], opset_imports={"": 21}
    )
    ir.save(ir.Model(graph, ir_version=10), tmp_path / "m.onnx", external_data="m.onnx.data")
    (tmp_path / "q.spill").unlink()  # the saved model no longer reads it

    saved = onnx.load(str(tmp_path / "m.onnx"))
    by_name = {t.name: onnx.numpy_helper.to_array(t) for t in saved.graph.initializer}
    np.testing.assert_array_equal(by_name["w"].astype(np.int8), codes.astype(np.int8))
    np.testing.assert_array_equal(by_name["s"], scale)
