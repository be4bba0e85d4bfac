"""Weights stored in a 16-bit type inside a float32 graph (``stored_weights``): ONNX Runtime
computes what the float32 graph computes, folding gives the float32 graph back, and a weight
that is not exact in the stored type is refused when written."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from llmc.compiler.weights.stored_weights import (
    STORED_SUFFIX,
    fold_stored_weights,
    store_weights,
    widen_segment,
)
from llmc.runtime.runners.ort_env import session_options


def _model(w: np.ndarray, bias: np.ndarray) -> ir.Model:
    """y = (x @ w) + bias and z = x @ w: ``w`` read by two nodes, ``bias`` by one."""
    x = ir.Value(name="x", shape=ir.Shape(["n", w.shape[0]]), type=ir.TensorType(ir.DataType.FLOAT))
    wv = ir.Value(name="w", const_value=ir.tensor(w, name="w"))
    bv = ir.Value(name="bias", const_value=ir.tensor(bias, name="bias"))
    for v in (wv, bv):
        v.shape, v.type = v.const_value.shape, ir.TensorType(ir.DataType.FLOAT)
    mm = ir.node("MatMul", [x, wv], name="mm")
    add = ir.node("Add", [mm.outputs[0], bv], name="add")
    mm2 = ir.node("MatMul", [x, wv], name="mm2")
    add.outputs[0].name, mm2.outputs[0].name = "y", "z"
    graph = ir.Graph(
        [x],
        [add.outputs[0], mm2.outputs[0]],
        nodes=[mm, add, mm2],
        initializers=[wv, bv],
        opset_imports={"": 21},
    )
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, x: np.ndarray, path) -> list[np.ndarray]:
    ir.save(model, path, external_data=path.name + ".data")
    session = ort.InferenceSession(
        str(path), session_options(1), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})


def _bf16_exact(shape, seed: int) -> np.ndarray:
    return (
        np.random.default_rng(seed).normal(size=shape).astype(ml_dtypes.bfloat16).astype(np.float32)
    )


@pytest.mark.parametrize("dtype", [ir.DataType.BFLOAT16, ir.DataType.FLOAT16])
def test_stored_graph_computes_the_float32_graph(dtype, tmp_path):
    w = _bf16_exact((64, 48), 0)
    if dtype == ir.DataType.FLOAT16:
        w = w.astype(np.float16).astype(np.float32)
    bias = _bf16_exact((48,), 1)
    x = np.random.default_rng(2).normal(size=(3, 64)).astype(np.float32)
    expected = _run(_model(w, bias), x, tmp_path / "wide.onnx")

    stored = _model(w, bias)
    assert store_weights(stored, dtype, min_bytes=1024) == 1  # bias (192 bytes) stays float32
    assert stored.graph.initializers["w" + STORED_SUFFIX].const_value.dtype == dtype
    assert [n.op_type for n in stored.graph].count("Cast") == 2  # one per reader
    got = _run(stored, x, tmp_path / "stored.onnx")
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)
    assert (tmp_path / "stored.onnx.data").stat().st_size == w.nbytes // 2

    loaded = ir.load(tmp_path / "stored.onnx")
    assert [v.name for v in fold_stored_weights(loaded)] == ["w"]
    assert "Cast" not in [n.op_type for n in loaded.graph]
    assert sorted(loaded.graph.initializers) == ["bias", "w"]
    np.testing.assert_array_equal(loaded.graph.initializers["w"].const_value.numpy(), w)
    for e, g in zip(expected, _run(loaded, x, tmp_path / "folded.onnx"), strict=True):
        np.testing.assert_array_equal(g, e)


def test_a_weight_not_exact_in_the_stored_type_is_refused_when_written(tmp_path):
    w = _bf16_exact((64, 48), 0)
    w[3, 5] += 1e-3  # no longer a bfloat16 value
    model = _model(w, _bf16_exact((48,), 1))
    store_weights(model, ir.DataType.BFLOAT16, min_bytes=1024)
    with pytest.raises(ValueError, match="w::stored: values are not exact in BFLOAT16"):
        ir.save(model, tmp_path / "m.onnx", external_data="m.onnx.data")


def test_float32_is_not_a_stored_type():
    with pytest.raises(ValueError, match="not FLOAT"):
        store_weights(_model(_bf16_exact((4, 4), 0), _bf16_exact((4,), 1)), ir.DataType.FLOAT)


def test_widen_segment_gives_onnx_runtime_float32_initializers(tmp_path):
    """ONNX Runtime leaves a Cast of an initializer unfolded past about 1 GB of output, so the
    build widens stored weights itself: the segment it hands over has no Cast, a float32
    initializer per stored weight (in the scratch file), and computes the same."""
    import onnx

    w, bias = _bf16_exact((64, 48), 0), _bf16_exact((48,), 1)
    x = np.random.default_rng(2).normal(size=(3, 64)).astype(np.float32)
    expected = _run(_model(w, bias), x, tmp_path / "wide.onnx")
    stored = _model(w, bias)
    store_weights(stored, ir.DataType.BFLOAT16, min_bytes=1024)
    ir.save(stored, tmp_path / "stored.onnx", external_data="stored.onnx.data")
    segment = onnx.load(str(tmp_path / "stored.onnx"), load_external_data=False)

    widened = widen_segment(segment, tmp_path, "scratch.data")
    assert "Cast" not in [n.op_type for n in widened.graph.node]
    (table,) = [t for t in widened.graph.initializer if t.name == "w"]
    assert table.data_type == onnx.TensorProto.FLOAT
    assert {e.key: e.value for e in table.external_data}["location"] == "scratch.data"
    assert (tmp_path / "scratch.data").stat().st_size == w.nbytes
    opts = session_options(1)
    opts.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(tmp_path)
    )
    session = ort.InferenceSession(
        widened.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    for e, g in zip(expected, session.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(g, e)
    assert widen_segment(widened, tmp_path, "none.data") is widened  # nothing stored: as it is
    assert not (tmp_path / "none.data").exists()


def saved_and_folded(tmp_path, w: np.ndarray) -> tuple[ir.ExternalTensor, ir.Value]:
    """``w`` stored in bfloat16 in a saved graph, loaded back: its stored tensor (an
    ExternalTensor of the graph's data file) and the float32 initializer folding gives."""
    stored = _model(w, _bf16_exact((w.shape[1],), 1))
    store_weights(stored, ir.DataType.BFLOAT16, min_bytes=1024)
    ir.save(stored, tmp_path / "stored.onnx", external_data="stored.onnx.data")
    loaded = ir.load(tmp_path / "stored.onnx")
    source = loaded.graph.initializers["w" + STORED_SUFFIX].const_value
    assert isinstance(source, ir.ExternalTensor)
    (wide,) = fold_stored_weights(loaded)
    return source, wide


def test_a_folded_weight_read_leaves_nothing_of_its_stored_bytes_mapped(tmp_path):
    """Reading a folded (widened) weight maps its stored bytes only while it reads them: a
    holder of the float32 tensor (an anchor's target, a quantizer) holds no pages of the file."""
    w = _bf16_exact((64, 48), 0)
    source, wide = saved_and_folded(tmp_path, w)
    np.testing.assert_array_equal(wide.const_value.numpy(), w)
    assert source.raw is None  # unmapped once read
    np.testing.assert_array_equal(wide.const_value.numpy(), w)  # and read again when asked
    assert source.raw is None
    held = source.numpy()  # a reader holding a view of the stored bytes keeps them mapped
    np.testing.assert_array_equal(wide.const_value.numpy(), w)
    np.testing.assert_array_equal(held.astype(np.float32), w)


def test_a_bfloat16_checkpoint_weight_is_stored_as_the_checkpoints_own_bytes(tmp_path):
    # A weight bound from a bfloat16 safetensors file (widened to float32 when read) is written
    # back as the file's bytes: no float32 value is made to narrow it again.
    from safetensors.numpy import save_file

    from llmc.compiler.weights.checkpoint_weights import bind_initializers, index_safetensors

    w, bias = _bf16_exact((64, 48), 3), np.zeros(48, np.float32)
    save_file({"w": w.astype(ml_dtypes.bfloat16)}, str(tmp_path / "model.safetensors"))
    model = _model(np.zeros_like(w), bias)
    index = index_safetensors([tmp_path / "model.safetensors"])
    bind_initializers(model.graph, index, {"bias": bias}, ir.DataType.FLOAT, prefix="")
    assert store_weights(model, ir.DataType.BFLOAT16) == 1
    stored = model.graph.initializers["w" + STORED_SUFFIX].const_value
    assert isinstance(stored, ir.ExternalTensor)
    assert stored.path == str(tmp_path / "model.safetensors")
    x = np.random.default_rng(4).normal(size=(5, 64)).astype(np.float32)
    y, z = _run(model, x, tmp_path / "stored.onnx")
    np.testing.assert_allclose(z, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x @ w + bias, rtol=1e-5, atol=1e-5)


def test_a_transposed_bfloat16_checkpoint_weight_is_written_from_the_checkpoints_bytes(
    tmp_path,
):
    # MatMul(x, Transpose(W)) as the exporter writes nn.Linear: the folded, transposed weight
    # is made from the stored bfloat16 bytes, never widened to float32 and narrowed back.
    from safetensors.numpy import save_file

    from llmc.compiler.passes.weight_transpose import TRANSPOSED_SOURCE, fold_weight_transposes
    from llmc.compiler.weights.checkpoint_weights import bind_initializers, index_safetensors

    w = _bf16_exact((48, 64), 5)  # [out, in], as nn.Linear stores it
    save_file({"w": w.astype(ml_dtypes.bfloat16)}, str(tmp_path / "model.safetensors"))
    x = ir.Value(name="x", shape=ir.Shape(["n", 64]), type=ir.TensorType(ir.DataType.FLOAT))
    wv = ir.Value(name="w", shape=ir.Shape([48, 64]), type=ir.TensorType(ir.DataType.FLOAT))
    transpose = ir.node("Transpose", [wv], {"perm": [1, 0]}, name="t")
    mm = ir.node("MatMul", [x, transpose.outputs[0]], name="mm")
    mm.outputs[0].name = "y"
    graph = ir.Graph([x], [mm.outputs[0]], nodes=[transpose, mm], initializers=[wv],
                     opset_imports={"": 21})  # fmt: skip
    model = ir.Model(graph, ir_version=10)
    bind_initializers(model.graph, index_safetensors([tmp_path / "model.safetensors"]), {},
                      ir.DataType.FLOAT, prefix="")  # fmt: skip
    assert fold_weight_transposes(model) == 1
    wide = model.graph.initializers["w_transposed"].const_value  # float32, transposed when read
    widened = []
    for tensor in (wide, wide.meta[TRANSPOSED_SOURCE][0]):  # the transpose and the widening
        tensor._func = functools.partial(lambda f: widened.append(1) or f(), tensor._func)
    assert store_weights(model, ir.DataType.BFLOAT16) == 1
    ir.save(model, tmp_path / "t.onnx", external_data="t.onnx.data")
    assert widened == []  # no float32 value was made
    session = ort.InferenceSession(str(tmp_path / "t.onnx"), session_options(1),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    xs = np.random.default_rng(6).normal(size=(3, 64)).astype(np.float32)
    (y,) = session.run(None, {"x": xs})
    np.testing.assert_allclose(y, xs @ w.T, rtol=1e-5, atol=1e-5)
