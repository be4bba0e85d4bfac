"""Lower an engine graph to the TensorRT 11 target: a strongly typed ONNX graph.

TensorRT 11 builds strongly typed networks only: the FP16/BF16/INT8/FP8 builder flags are gone and
every tensor's precision is what the graph's types and its Q/DQ nodes say (TensorRT 11.0 Python
API, ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``: "Deprecated in TensorRT 11.0. Strongly typed
mode is always enabled"). So the lowering writes precision into the graph:

- Input: the graph the CPU path builds before its ONNX Runtime lowering (export with one
  ``llmc::PagedAttention`` plugin node per layer, graph passes, and for ``--quant`` the symmetric
  Q/DQ nodes of ``llmc.compiler.quantize``). FP8 weights stay real FP8 E4M3 DequantizeLinear
  nodes (the CPU path replaces them by float32 weights, ``formats.fp8.emulate_fp8_weights``;
  TensorRT runs them on FP8 tensor cores).
- Every float32 tensor becomes the engine's compute dtype (``float16`` or ``bfloat16``):
  initializers, Constant values, Cast targets, Q/DQ scales (a DequantizeLinear outputs its scale's
  type, ONNX opset 21+), graph inputs and value infos. Integer tensors, Q/DQ data and zero points
  keep their types.
- Except the rotary angles: ``positions`` (int64) -> Cast(float) -> x inv_freq -> Cos/Sin stays
  float32 and is cast to the compute dtype after Cos/Sin, as Hugging Face computes RoPE (float32
  angles; position 4095 x inv_freq 1.0 in float16 would be off by up to 2 radians).
- ``logits`` stay float32 (DESIGN §3): a Cast is appended after the vocabulary projection.
- KV-cache graph inputs (``key_cache.<i>``, ``value_cache.<i>``) get the cache dtype the plugin
  reads: the compute dtype for ``kv_cache_dtype`` auto, else FLOAT8E4M3FN or INT8 (the plugin's
  ``kv_cache_dtype`` attribute says which, ``llmc.plugins.schema``).
- Each quantization format rewrites its Q/DQ nodes for TensorRT (``rewrite_for_tensorrt``):
  block-wise INT8 weights (8-bit weight-only layers) become per-channel INT8, as TensorRT's
  block dequantization takes FP4, FP8 and INT4 only (``int8_weights.py``).
- A streamed build's graph (weights external, in the build's work directory) is lowered by
  ``lower_streamed`` without reading them: the same structure rewrites, and the weights that
  change are computed one at a time when the stage is written (``lazy_weights.py``).
- Each PagedAttention node gets what the TensorRT plugin declares: every attribute, ``aot=1``,
  and the two aliased cache outputs as graph outputs (``plugin_io.py``). The CPU engine's graph
  is built before this and keeps its one-output nodes.

Nothing here has run on a GPU or through TensorRT's parser; ``lint.py`` checks the result against
TensorRT's documented ONNX support table.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.tensorrt.plugin_io import rewrite_plugin_nodes
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.weights.lazy_weights import EAGER, Weights, detach
from llmc.compiler.weights.stored_weights import fold_stored_weights
from llmc.engine.graph import LOGITS
from llmc.engine.kv_cache import onnx_cache_type
from llmc.engine.plugin import plugin_nodes

#: Engine compute dtypes of GPU targets -> ONNX element type.
COMPUTE_TYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
}
_NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
_INT_TYPES = {TensorProto.INT32, TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8}
# Ops the float32 rotary-angle region may pass through (all float inputs in the region or constant).
_ANGLE_OPS = {"Mul", "Div", "Add", "Sub", "Neg", "Unsqueeze", "Squeeze", "Reshape", "Concat"}
_ANGLE_OPS |= {"Transpose", "Expand", "Cos", "Sin"}


def kv_cache_elem_type(kv_cache_dtype: str, dtype: str) -> int:
    """ONNX element type of the KV-cache graph inputs for ``--kv-cache-dtype`` and ``--dtype``."""
    return onnx_cache_type(kv_cache_dtype, COMPUTE_TYPES[dtype])


def lower_for_tensorrt(
    model: onnx.ModelProto, dtype: str, kv_cache_dtype: str = "auto"
) -> onnx.ModelProto:
    """Rewrite ``model`` (in place, also returned; it holds its weights) into the TensorRT graph
    for ``dtype`` ("float16", "bfloat16" or "float32") and ``kv_cache_dtype`` ("auto", "fp8",
    "int8").

    Raises ValueError for an unknown dtype or a graph without a ``logits`` output.
    """
    _check(model, dtype)
    for fmt in FORMATS.values():  # before the float conversion: scales are still float32
        fmt.rewrite_for_tensorrt(model)
    _lower_graph(model, dtype, kv_cache_dtype, EAGER)
    return model


def lower_streamed(
    model: onnx.ModelProto, weights_dir: Path, dtype: str, kv_cache_dtype: str = "auto"
) -> ir.Model:
    """``lower_for_tensorrt`` of a graph whose weights are external data in ``weights_dir``
    (a streamed build), reading none of them: the graph's structure is rewritten as there, and
    each weight that changes (casts to ``dtype``, the formats' weight rewrites) becomes an
    ``onnx_ir.LazyTensor`` over its source, computed when the returned model is saved
    (``onnx_ir.save`` with external data: one tensor at a time). ``model`` is modified.

    Raises ValueError as ``lower_for_tensorrt``.
    """
    _check(model, dtype)
    lazy = ir.from_proto(model)  # external tensors: nothing read
    ir.external_data.set_base_dir(lazy.graph, weights_dir)
    fold_stored_weights(lazy)  # a float graph's 16-bit stored weights: float32 again
    for fmt in FORMATS.values():  # on the onnx_ir model: weights rewritten when written
        fmt.rewrite_for_tensorrt(lazy)
    proto, weights = detach(lazy)
    _lower_graph(proto, dtype, kv_cache_dtype, weights)
    return weights.attach(proto)


def _check(model: onnx.ModelProto, dtype: str) -> None:
    """Refuse an unknown ``dtype`` or a graph without logits; name unnamed nodes (the float
    conversion tells nodes apart by name)."""
    if dtype not in COMPUTE_TYPES:
        raise ValueError(
            f"TensorRT compute dtype must be one of {list(COMPUTE_TYPES)}, not {dtype}"
        )
    g = model.graph
    if LOGITS not in {o.name for o in g.output}:
        raise ValueError("the engine graph has no 'logits' output")
    for i, n in enumerate(g.node):
        n.name = n.name or f"{n.op_type}_{i}.unnamed"


def _lower_graph(model: onnx.ModelProto, dtype: str, kv_cache_dtype: str, weights: Weights) -> None:
    """What follows the formats' rewrites: the float conversion (values through
    ``weights``), the KV-cache input types and the plugin nodes."""
    g = model.graph
    if dtype != "float32":
        keep = _rotary_angle_region(g)
        _convert_floats(g, dtype, keep, weights)
        _keep_logits_float32(g, COMPUTE_TYPES[dtype])
    cache_type = kv_cache_elem_type(kv_cache_dtype, dtype)
    caches = {n for p in plugin_nodes(model) for n in p.input[3:5]}
    for vi in g.input:
        if vi.name in caches:
            vi.type.tensor_type.elem_type = cache_type
    rewrite_plugin_nodes(model)


def _rotary_angle_region(g: onnx.GraphProto) -> set[str]:
    """Names of nodes that compute rotary angles from integer positions (kept float32): the
    forward closure of Cast(int -> float) through ``_ANGLE_OPS``, ending at Cos/Sin."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info]}
    consts = {t.name for t in g.initializer}
    consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    region: set[str] = set()
    values: set[str] = set()
    frontier = [
        n
        for n in g.node
        if n.op_type == "Cast"
        and _attr(n, "to") == TensorProto.FLOAT
        and types.get(n.input[0]) in _INT_TYPES
    ]
    while frontier:
        n = frontier.pop()
        if n.name in region:
            continue
        region.add(n.name)
        values.update(n.output)
        if n.op_type in ("Cos", "Sin"):
            continue
        for out in n.output:
            for c in consumers.get(out, []):
                inside = all(i in values or i in consts or not i for i in c.input)
                if c.op_type in _ANGLE_OPS and inside:
                    frontier.append(c)
    return region


def _convert_floats(g: onnx.GraphProto, dtype: str, keep: set[str], weights: Weights) -> None:
    target = COMPUTE_TYPES[dtype]
    kept = [n for n in g.node if n.name in keep]
    kept_values = {o for n in kept for o in n.output}
    kept_inputs = {i for n in kept for i in n.input}
    other_inputs = {i for n in g.node if n.name not in keep for i in n.input}
    # float32 initializers read only inside the region stay float32; shared ones get a copy
    inits = list(g.initializer)
    for t in inits:
        if t.data_type != TensorProto.FLOAT:
            continue
        if t.name in kept_inputs and t.name in other_inputs:
            copy = weights.copy(t, t.name + ".float32")
            g.initializer.append(copy)
            for n in kept:
                _rename_input(n, t.name, copy.name)
        if t.name in kept_inputs and t.name not in other_inputs:
            continue
        weights.cast(t, target, _NUMPY[dtype])
    for n in g.node:
        if n.name in keep:
            continue
        if n.op_type == "Cast" and _attr(n, "to") == TensorProto.FLOAT:
            _set_attr(n, helper.make_attribute("to", target))
        if n.op_type == "Constant" and n.attribute[0].name in ("value_float", "value_floats"):
            value = np.asarray(helper.get_attribute_value(n.attribute[0]), _NUMPY[dtype])
            del n.attribute[:]
            n.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                value = numpy_helper.to_array(a.t).astype(_NUMPY[dtype])
                a.t.CopyFrom(numpy_helper.from_array(value, a.t.name))
            if a.name == "output_dtype" and a.i == TensorProto.FLOAT:
                a.i = target
    init_names = {t.name for t in g.initializer}
    infos = [vi for vi in g.value_info if vi.name not in init_names]  # redundant, and stale now
    del g.value_info[:]
    g.value_info.extend(infos)
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.name not in kept_values and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = target
    # region outputs read outside it: Cast to the compute dtype right after their producer
    for value in sorted(kept_values & other_inputs):
        cast_out = f"{value}.{dtype}"
        cast = helper.make_node("Cast", [value], [cast_out], f"{value}/cast_{dtype}", to=target)
        for n in g.node:
            if n.name not in keep:
                _rename_input(n, value, cast_out)
        at = next(i for i, n in enumerate(g.node) if value in n.output)
        g.node.insert(at + 1, cast)


def _keep_logits_float32(g: onnx.GraphProto, compute_type: int) -> None:
    inner = f"{LOGITS}.compute"
    for n in g.node:
        n.output[:] = [inner if o == LOGITS else o for o in n.output]
    g.node.append(helper.make_node("Cast", [inner], [LOGITS], "logits/cast_float32", to=1))
    for o in g.output:
        if o.name == LOGITS:
            o.type.tensor_type.elem_type = TensorProto.FLOAT


def _rename_input(node: onnx.NodeProto, old: str, new: str) -> None:
    node.input[:] = [new if i == old else i for i in node.input]


def _attr(node: onnx.NodeProto, name: str):
    a = next((a for a in node.attribute if a.name == name), None)
    return None if a is None else helper.get_attribute_value(a)


def _set_attr(node: onnx.NodeProto, attr: onnx.AttributeProto) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == attr.name:
            node.attribute[i].CopyFrom(attr)
            return
    node.attribute.append(attr)
