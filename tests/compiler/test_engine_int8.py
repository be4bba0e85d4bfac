"""Scorings on the engine's int8 kernel: ``to_block_int8`` writes the weights as ONNX Runtime's
own DQ + MatMul fusion does (compared with ORT's optimized graph), runs them on
``llmc::BlockInt8MatMul`` to float32 rounding of ORT's ``MatMulNBits``, leaves other weights to
ORT, and a tiny Gemma 3's held-out scoring comes out the same either way."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.frontend.model_source import load_model, resolve_model
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.qdq import drop_dead
from llmc.compiler.quantize.search.assignment_eval import AssignmentScorer
from llmc.compiler.quantize.search.engine_int8 import to_block_int8
from llmc.compiler.stages.export import float_graph
from llmc.plugins.int8_matmul import OP_TYPE
from llmc.plugins.paged_attention import ort_op
from llmc.quant.protocol import QuantSpec
from llmc.runtime.runners.ort_env import session_options
from tests.tiny_models import make_tiny_gemma3

needs_kernel = pytest.mark.skipif(ort_op.library_path() is None, reason="custom-op library")


def _dq_matmul(codes, scales, block: int, axis: int = 0, zero_point=None) -> onnx.ModelProto:
    k, n = codes.shape
    inits = [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(scales, "s")]
    dq_inputs = ["w", "s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "z"))
        dq_inputs.append("z")
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", dq_inputs, ["wd"], axis=axis, block_size=block),
            helper.make_node("MatMul", ["x", "wd"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _converted(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """``model`` through ``to_block_int8`` (which must replace ``count`` MatMuls) and
    ``drop_dead``, as a scoring's segment goes."""
    graph = ir.from_proto(model)
    assert to_block_int8(graph) == count
    drop_dead(graph.graph)
    return ir.to_proto(graph)


def _weights(k: int, n: int, block: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(-128, 128, (k, n)).astype(np.int8)
    return codes, (rng.random((k // block, n)) * 0.02 + 0.001).astype(np.float32)


def _session(model: onnx.ModelProto, optimized: str | None = None) -> ort.InferenceSession:
    opts = session_options(1)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ort_op.register(opts)
    if optimized is not None:
        opts.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def test_weights_are_laid_out_as_onnx_runtimes_fusion_lays_them_out(tmp_path):
    codes, scales = _weights(96, 80, 32)
    model = _dq_matmul(codes, scales, 32)
    _session(model, str(tmp_path / "fused.onnx"))  # ORT fuses DQ + MatMul into MatMulNBits
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    node = next(n for n in fused.graph.node if n.op_type == "MatMulNBits")
    ort_inits = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    ours = _converted(_dq_matmul(codes, scales, 32), 1)
    [mine] = ours.graph.node
    assert (mine.op_type, mine.domain) == (OP_TYPE, "llmc")
    our_inits = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    for theirs, own in zip(node.input[1:], mine.input[1:], strict=True):
        assert np.array_equal(ort_inits[theirs], our_inits[own])
    attrs = {a.name: helper.get_attribute_value(a) for a in mine.attribute}
    assert attrs == {"K": 96, "N": 80, "bits": 8, "block_size": 32}
    assert set(our_inits) == set(mine.input[1:])  # the codes and scales of the DQ are gone


@needs_kernel
def test_block_int8_computes_what_matmulnbits_computes():
    codes, scales = _weights(128, 64, 32, seed=1)
    x = np.random.default_rng(2).standard_normal((7, 128)).astype(np.float32)
    want = _session(_dq_matmul(codes, scales, 32)).run(None, {"x": x})[0]
    model = _converted(_dq_matmul(codes, scales, 32), 1)
    got = _session(model).run(None, {"x": x})[0]
    exact = x @ (codes.astype(np.float32) * np.repeat(scales, 32, axis=0))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()  # int8 activations, not float


def test_weights_the_kernel_does_not_take_are_left_to_onnx_runtime():
    codes, scales = _weights(64, 32, 32)
    per_channel = _dq_matmul(codes, scales[:1], 0, axis=1)  # per output channel, not blocks
    with_zero_point = _dq_matmul(codes, scales, 32, zero_point=np.zeros_like(codes[:2]))
    fp8 = _dq_matmul(codes.astype(np.float32).astype(ml_dtypes.float8_e4m3fn), scales, 32)
    for model in (per_channel, with_zero_point, fp8):
        assert _converted(model, 0).graph.node[0].op_type == "DequantizeLinear"


@needs_kernel
def test_a_scoring_on_the_kernel_reports_what_one_on_matmulnbits_does(tmp_path, monkeypatch):
    from llmc.compiler.quantize.search import segment_quantizer

    converted = []
    monkeypatch.setattr(
        segment_quantizer, "to_block_int8", lambda m: converted.append(to_block_int8(m))
    )
    ckpt = make_tiny_gemma3(tmp_path / "ckpt", seed=4)
    proto, _ = float_graph(load_model(resolve_model(str(ckpt)), "float32"), 16)
    spec = QuantSpec(quant="int8", weight_only8_block_size=32)
    targets = find_targets(ir.from_proto(proto))
    w8 = "int8_weight_only"
    precomputed = {(t.module, w8): FORMATS[w8].quantize(t.weight(), None, spec) for t in targets}
    rng = np.random.default_rng(3)
    sets = {"s": [rng.integers(3, 500, 48) for _ in range(2)]}
    every = tuple((t.module, w8) for t in targets)

    def score(block_int8: bool):
        with AssignmentScorer(
            proto, precomputed, sets, {"s": "x"}, 1, block_int8=block_int8
        ) as scorer:
            return scorer.score(every, "s")

    ort_report = score(False)
    assert converted == []
    kernel_report = score(True)
    assert sum(converted) == len(targets)  # every projection on the kernel, lm_head included
    assert kernel_report.mean_kl > 0
    assert kernel_report.mean_kl == pytest.approx(ort_report.mean_kl, rel=1e-3)
    assert kernel_report.top1_agreement == pytest.approx(ort_report.top1_agreement, abs=0.02)
