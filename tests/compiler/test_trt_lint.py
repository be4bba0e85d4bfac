"""TensorRT lowering and lint on tiny Llama and Gemma 3 graphs: the lowered graphs pass at
none/fp8/int8/int4 with the precision written into their types, and planted faults fail with the
node, the op and what is wrong. (No TensorRT here: the lint is the check, DESIGN §6.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import llmc.compiler.backends.tensorrt.lower as lower_mod
from llmc.calibration.collect import collect_stats
from llmc.compiler.backends.tensorrt.lint import lint_model
from llmc.compiler.backends.tensorrt.lower import lower_for_tensorrt
from llmc.compiler.frontend.model_source import load_model, resolve_model
from llmc.compiler.quantize.qdq import QuantSpec, calibration_tensors, quantize_graph
from llmc.compiler.stages.export import float_graph
from llmc.engine.plugin import DOMAIN, plugin_nodes
from llmc.plugins.paged_attention.reference import paged_attention_reference
from llmc.runtime.runners.ort_runner import OrtRunner
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

BLOCK = 16
SEQ = 32
MODELS = {"llama": make_tiny_llama, "gemma": make_tiny_gemma3}


@pytest.fixture(scope="module")
def float_graphs(tmp_path_factory):
    """{name: float32 engine graph} of the tiny models, exported once."""
    graphs = {}
    for name, make in MODELS.items():
        ckpt = make(tmp_path_factory.mktemp(name) / "ckpt", seed=2)
        graphs[name], _ = float_graph(load_model(resolve_model(str(ckpt)), "float32"), BLOCK)
    return graphs


def _graph(float_graphs, name: str, quant: str, kv: str = "auto") -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.CopyFrom(float_graphs[name])
    if quant == "none":
        return proto
    spec = QuantSpec(quant=quant, int4_block_size=64, weight_only8=("lm_head",), kv_cache_dtype=kv)
    graph = ir.from_proto(proto)
    tensors = calibration_tensors(graph, spec)
    runner = OrtRunner.from_model(proto, SEQ // BLOCK, extra_outputs=tuple(tensors.values()))
    rng = np.random.default_rng(0)
    windows = [rng.integers(3, 512, SEQ) for _ in range(3)]
    quantize_graph(graph, collect_stats(runner, tensors, windows), spec)
    return ir.to_proto(graph)


def _lowered(float_graphs, name, quant, dtype="bfloat16", kv="auto") -> onnx.ModelProto:
    return lower_for_tensorrt(_graph(float_graphs, name, quant, kv), dtype, kv)


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's element type by ONNX inference (plugin outputs typed like their q)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    nodes = []
    for n in m.graph.node:  # output like q, then the aliased caches like their inputs
        if n.domain == DOMAIN:
            pairs = zip([n.input[0], n.input[3], n.input[4]], n.output, strict=True)
            nodes += [helper.make_node("Identity", [i], [o]) for i, o in pairs]
        else:
            nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    g = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph
    out = {t.name: t.data_type for t in g.initializer}
    for vi in [*g.input, *g.output, *g.value_info]:
        out[vi.name] = vi.type.tensor_type.elem_type
    return out


@pytest.mark.parametrize("name", ["llama", "gemma"])
@pytest.mark.parametrize("quant", ["none", "fp8", "int8", "int4"])
def test_lowered_graphs_pass_with_precision_in_their_types(float_graphs, name, quant):
    model = _lowered(float_graphs, name, quant)
    report = lint_model(model, "sm90")
    assert report.passed, report.format()
    assert report.warnings == []
    g = model.graph
    types = _types(model)
    nodes = list(g.node)
    # logits float32 after a final Cast; everything else bf16 except the rotary angles; then
    # the caches the plugin writes in place, as graph outputs aliased to the cache inputs
    plugins = plugin_nodes(model)
    caches = [c for p in plugins for c in p.input[3:5]]
    assert [o.name for o in g.output] == ["logits", *(f"{c}.updated" for c in caches)]
    assert [o.type.tensor_type.elem_type for o in g.output] == [TensorProto.FLOAT] + [
        TensorProto.BFLOAT16
    ] * len(caches)
    assert all(len(p.output) == 3 for p in plugins)
    assert nodes[-1].op_type == "Cast" and nodes[-1].output[0] == "logits"
    float32_inits = [t.name for t in g.initializer if t.data_type == TensorProto.FLOAT]
    assert all("inv_freq" in n for n in float32_inits), float32_inits
    cos_sin = [n for n in nodes if n.op_type in ("Cos", "Sin")]
    assert cos_sin and all(types.get(n.input[0]) in (None, TensorProto.FLOAT) for n in cos_sin)
    for n in nodes:
        if n.op_type == "MatMul":
            assert types[n.input[0]] == types[n.input[1]] == TensorProto.BFLOAT16, n.name
    dq = [n for n in nodes if n.op_type == "DequantizeLinear"]
    q = [n for n in nodes if n.op_type == "QuantizeLinear"]
    if quant == "none":
        assert not dq and not q
        return
    for n in q + dq:
        assert types[n.input[1]] == TensorProto.BFLOAT16  # scales carry the compute dtype
    data_types = sorted({types[n.input[0]] for n in dq if n.input[0] in types})
    wanted = {"fp8": TensorProto.FLOAT8E4M3FN, "int8": TensorProto.INT8, "int4": TensorProto.INT4}
    assert wanted[quant] in data_types  # FP8 weights stay real FP8 (not emulated in float)
    inits = {t.name for t in g.initializer}
    weight_dq = {d.output[0] for d in dq if d.input[0] in inits}
    reading = [n for n in nodes if n.op_type == "MatMul" and n.input[1] in weight_dq]
    assert len(reading) == len(weight_dq)  # every weight DQ is the B of exactly one MatMul
    if quant == "int4":
        assert not q  # weight-only


def test_fp8_kv_cache_inputs_are_fp8_and_lint_warns_it_is_unverified(float_graphs):
    model = _lowered(float_graphs, "gemma", "int8", kv="fp8")
    types = _types(model)
    for p in plugin_nodes(model):
        assert types[p.input[3]] == types[p.input[4]] == TensorProto.FLOAT8E4M3FN
    report = lint_model(model, "sm90")
    assert report.passed
    assert len(report.warnings) == 4 and all("unverified" in w.message for w in report.warnings)
    on_ampere = lint_model(model, "sm80")
    assert on_ampere.passed  # fp8 KV storage is not an FP8 Q/DQ: the plugin owns it


def test_fp8_graph_fails_below_sm89(float_graphs):
    report = lint_model(_lowered(float_graphs, "llama", "fp8"), "sm86")
    assert not report.passed
    assert {f.check for f in report.errors} == {"qdq"}
    assert all("FP8 needs sm89 or newer; target is sm86" in f.message for f in report.errors)


def _find(model, op_type, index=0) -> onnx.NodeProto:
    return [n for n in model.graph.node if n.op_type == op_type][index]


def _set_init(model, name, array) -> None:
    for t in model.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(array, name))


def test_planted_unsupported_op(float_graphs):
    model = _lowered(float_graphs, "llama", "none")
    model.graph.node.append(
        helper.make_node("Unique", ["input_ids"], ["uniq"], "planted_unique", sorted=1)
    )
    errors = lint_model(model, "sm90").errors
    assert [(e.check, e.node, e.op) for e in errors] == [("op", "planted_unique", "Unique")]
    assert "marked unsupported (N)" in errors[0].message


def test_planted_asymmetric_qdq(float_graphs):
    model = _lowered(float_graphs, "gemma", "int8")
    q = _find(model, "QuantizeLinear", 1)
    _set_init(model, q.input[2], np.array(3, np.int8))  # shared by its Q and DQ
    errors = lint_model(model, "sm90").errors
    named = {(e.node, e.op) for e in errors}
    assert (q.name, "QuantizeLinear") in named
    assert all("asymmetric" in e.message and "max |zp| = 3" in e.message for e in errors)
    assert len(errors) == 2  # the Q and its DQ


def test_planted_plugin_missing_attribute_and_wrong_version(float_graphs):
    model = _lowered(float_graphs, "gemma", "none")
    p0, p1 = plugin_nodes(model)
    kept = [a for a in p1.attribute if a.name != "sliding_window"]
    del p1.attribute[:]
    p1.attribute.extend(kept)
    next(a for a in p0.attribute if a.name == "plugin_version").s = b"7"
    errors = lint_model(model, "sm90").errors
    assert [(e.node, e.check) for e in errors] == [
        (p0.name, "plugin"),
        (p1.name, "plugin"),
        (p1.name, "fields"),
    ]
    assert "plugin_version='7', this llmc registers '1'" in errors[0].message
    assert errors[1].message == "missing attribute(s) sliding_window"


def test_planted_int4_per_channel_and_small_blocks(float_graphs):
    model = _lowered(float_graphs, "llama", "int4")
    dq, dq2 = _find(model, "DequantizeLinear"), _find(model, "DequantizeLinear", 1)
    kept = [a for a in dq.attribute if a.name != "block_size"]
    del dq.attribute[:]
    dq.attribute.extend(kept)
    next(a for a in dq2.attribute if a.name == "block_size").i = 32
    int4 = [(e.node, e.message) for e in lint_model(model, "sm90").errors if e.check == "int4"]
    assert int4 == [
        (dq.name, "INT4 weights must be block-wise (DequantizeLinear block_size, opset 21); "
         "this one is per-tensor or per-channel"),
        (dq2.name, "INT4 block size 32: TensorRT supports 64 and 128"),
    ]  # fmt: skip


def test_planted_data_dependent_shape(float_graphs):
    model = _lowered(float_graphs, "llama", "none")
    g = model.graph
    g.node.extend(
        [
            helper.make_node("NonZero", ["input_ids"], ["nz"], "planted_nonzero"),
            helper.make_node("Reshape", ["positions", "nz"], ["reshaped"], "planted_reshape"),
            helper.make_node("Reshape", ["positions", "seq_lens"], ["r2"], "planted_reshape2"),
        ]
    )
    shape = [e for e in lint_model(model, "sm90").errors if e.check == "shape"]
    assert [(e.node, e.op) for e in shape] == [
        ("planted_reshape", "Reshape"),
        ("planted_reshape2", "Reshape"),
    ]
    assert "NonZero node 'planted_nonzero' output (data-dependent shape)" in shape[0].message
    assert "graph input 'seq_lens'" in shape[1].message


def test_planted_mixed_float_types_fail_strict_typing(float_graphs):
    model = _lowered(float_graphs, "llama", "none", dtype="float16")
    w = next(t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT16)
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).astype(np.float32), w.name))
    assert w.name == "model.model.embed_tokens.weight"  # read by the first RMSNormalization
    first_norm = _find(model, "RMSNormalization").name
    errors = lint_model(model, "sm90").errors
    assert errors[0].check == "types"  # later errors are its consequences (float32 q/k/v)
    assert "strict ONNX type inference failed" in errors[0].message
    assert f"op_type:RMSNormalization, node name: {first_norm}" in errors[0].message


class PagedAttention(OpRun):  # the class name is the op type the evaluator matches
    """``llmc::PagedAttention`` for onnx's ReferenceEvaluator: the torch reference, in float32."""

    op_domain = "llmc"

    def _run(self, q, k, v, key_cache, value_cache, seq_lens, qsl, block_tables, slots, **_):
        def t(x):
            return torch.from_numpy(np.asarray(x, np.float32))

        out = paged_attention_reference(
            t(q), t(k), t(v), t(key_cache), t(value_cache), torch.from_numpy(seq_lens),
            torch.from_numpy(qsl), torch.from_numpy(block_tables), torch.from_numpy(slots),
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            scale=self.scale, sliding_window=self.sliding_window or None,
            logit_softcap=self.logit_softcap or None,
        )  # fmt: skip
        return (out.numpy().astype(q.dtype), key_cache, value_cache)


def _logits(model: onnx.ModelProto, start: int, dtype) -> np.ndarray:
    """Logits of the last of 40 prompt tokens at positions start..start+39 (onnx reference)."""
    t, block = 40, BLOCK
    rng = np.random.default_rng(0)
    p = plugin_nodes(model)[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in p.attribute}
    feeds = {
        "input_ids": rng.integers(3, 500, t).astype(np.int64),
        "positions": np.arange(start, start + t, dtype=np.int64),
        "logits_indices": np.array([t - 1], np.int64),
        "seq_lens": np.array([t], np.int32),
        "query_start_loc": np.array([0, t], np.int32),
        "block_tables": np.arange(3, dtype=np.int32)[None],
        "slot_mapping": np.arange(t, dtype=np.int64),
    }
    shape = (3, block, attrs["num_kv_heads"], attrs["head_dim"])
    for i in model.graph.input:
        if i.name.startswith(("key_cache", "value_cache")):
            feeds[i.name] = np.zeros(shape, dtype)
    return ReferenceEvaluator(model, new_ops=[PagedAttention]).run(None, feeds)[0]


@pytest.mark.parametrize("name", ["llama", "gemma"])
def test_float16_lowering_computes_what_the_float32_graph_does(float_graphs, name, monkeypatch):
    """Run by onnx's reference evaluator (TensorRT is unavailable): at positions 3000+ the
    float16 graph stays within float16 rounding of float32, and keeping the rotary angles in
    float32 is what makes it so (without that region the error grows several-fold)."""
    reference = _logits(_graph(float_graphs, name, "none"), 3000, np.float32)
    lowered = _logits(_lowered(float_graphs, name, "none", dtype="float16"), 3000, np.float16)
    assert lowered.dtype == np.float32 and lowered.shape == reference.shape == (1, 512)
    error = np.abs(lowered - reference).max()
    assert error < 0.01 * np.abs(reference).max()
    assert lowered.argmax() == reference.argmax()
    monkeypatch.setattr(lower_mod, "_rotary_angle_region", lambda g: set())
    naive = _logits(_lowered(float_graphs, name, "none", dtype="float16"), 3000, np.float16)
    assert np.abs(naive - reference).max() > 4 * error


def test_planted_unsorted_graph(float_graphs):
    model = _lowered(float_graphs, "llama", "none")
    last = model.graph.node[-1]  # the logits Cast, moved before its producer
    model.graph.node.insert(0, onnx.NodeProto())
    model.graph.node[0].CopyFrom(last)
    del model.graph.node[-1]
    graph_errors = [e for e in lint_model(model, "sm90").errors if e.check == "graph"]
    assert [(e.node, e.op) for e in graph_errors] == [("logits/cast_float32", "Cast")]
    assert "input 'logits.compute' is produced by a later node" in graph_errors[0].message
