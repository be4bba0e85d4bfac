"""Split an engine graph at its plugin nodes into ONNX Runtime segments (DESIGN §6).

Used by the build, which writes the segments and their plan (``llmc.engine.plan``) into a CPU
engine, and by the runtime, which runs an in-memory graph the same way
(``OrtRunner.from_model``: calibration, the accuracy report, ``llmc verify``).

ONNX Runtime runs every node except ``llmc::PagedAttention``; the plugin runs as our CPU kernel
between two segments, on the runner's KV cache by reference (an ORT custom op in Python would
copy every input, the cache included, on each call). Segment ``i`` holds the nodes between plugin
``i - 1`` and plugin ``i`` in graph order, so a step is: segment 0, plugin 0, segment 1, ...,
plugin L-1, segment L.
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.engine.plan import ExecutionPlan, PluginCall, SegmentSpec
from llmc.engine.plugin import is_plugin_node, plugin_nodes


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Type of every tensor, with plugin outputs typed like their q input ([T, H*D])."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types = {v.name: v for v in [*g.input, *g.output, *g.value_info]}
    for node in plugin_nodes(model):
        q = types.get(node.input[0])
        if q is not None:
            types[node.output[0]] = helper.make_value_info(node.output[0], q.type)
    return types


def split_at_plugins(
    model: onnx.ModelProto,
    file_pattern: str = "segment_{:03d}.onnx",
    extra_outputs: tuple[str, ...] = (),
) -> tuple[list[onnx.ModelProto], ExecutionPlan]:
    """Cut ``model`` at its PagedAttention nodes.

    Returns the segment models (each with the initializers it uses; an initializer used by two
    segments, e.g. a tied embedding, is copied into both) and the plan a runner follows.
    ``extra_outputs`` are node outputs that must leave the segment computing them (calibration
    reads activations this way). Raises ValueError if the graph has no plugin node, uses
    control-flow subgraphs, or an extra output is no node's output.
    """
    g = model.graph
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in g.node
        for a in n.attribute
    ):
        raise ValueError("graphs with control-flow subgraphs cannot be segmented")
    plugins = [n for n in g.node if is_plugin_node(n)]
    if not plugins:
        raise ValueError("the graph has no llmc::PagedAttention node")
    types = _value_types(model)
    initializers = {t.name: t for t in g.initializer}

    groups: list[list[onnx.NodeProto]] = [[]]
    for node in g.node:
        if is_plugin_node(node):
            groups.append([])
        else:
            groups[-1].append(node)
    groups = _rematerialize_shape_math(g, groups, types, initializers)

    # Which later consumer (segment index or plugin index) needs each tensor.
    needed_after: dict[str, int] = {o.name: len(groups) for o in g.output}
    node_outputs = {o for n in g.node for o in n.output}
    unknown = [n for n in extra_outputs if n not in node_outputs]
    if unknown:
        raise ValueError(f"extra outputs are not node outputs of the graph: {unknown[:5]}")
    needed_after.update({n: len(groups) for n in extra_outputs})
    for i, group in enumerate(groups):
        own = {o for n in group for o in n.output}
        for node in group:
            for name in node.input:
                if name not in own:
                    needed_after[name] = max(needed_after.get(name, -1), i)
    for i, node in enumerate(plugins):
        for name in node.input:
            # Plugin i runs after segment i: a tensor it reads must leave segment <= i.
            needed_after[name] = max(needed_after.get(name, -1), i + 1)

    segments, specs = [], []
    for i, group in enumerate(groups):
        produced = {o for n in group for o in n.output if o}
        used = [name for n in group for name in n.input if name]
        inputs = list(dict.fromkeys(n for n in used if n not in produced and n not in initializers))
        inits = [initializers[n] for n in dict.fromkeys(used) if n in initializers]
        outputs = [
            n
            for n in dict.fromkeys(o for nd in group for o in nd.output if o)
            if needed_after.get(n, -1) > i
        ]
        graph = helper.make_graph(
            group,
            f"segment_{i}",
            [_typed(types, n) for n in inputs],
            [_typed(types, n) for n in outputs],
            initializer=inits,
        )
        seg = helper.make_model(graph, opset_imports=list(model.opset_import))
        seg.ir_version = model.ir_version
        segments.append(seg)
        specs.append(SegmentSpec(file=file_pattern.format(i), inputs=inputs, outputs=outputs))
    plan = ExecutionPlan(specs, [PluginCall.from_node(n) for n in plugins], logits=g.output[0].name)
    return segments, plan


# Integer shape arithmetic that is cheaper to recompute in each segment than to pass between
# segments: as a segment input its value is unknown when the segment is compiled, so a
# compiler (OpenVINO, TensorRT) cannot fold it and sees dynamic ranks.
_SHAPE_OPS = {
    "Constant",
    "Shape",
    "Gather",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Slice",
    "Cast",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Equal",
    "Where",
    "Range",
    "Reshape",
}
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


def _rematerialize_shape_math(
    g: onnx.GraphProto,
    groups: list[list[onnx.NodeProto]],
    types: dict[str, onnx.ValueInfoProto],
    initializers: dict[str, onnx.TensorProto],
) -> list[list[onnx.NodeProto]]:
    """Copy the producers of integer shape tensors into every segment that reads them, so that
    only activations (and graph inputs) cross segment boundaries."""
    graph_inputs = {i.name for i in g.input}
    producer: dict[str, onnx.NodeProto] = {}
    for node in g.node:
        if node.op_type not in _SHAPE_OPS or node.domain not in ("", "ai.onnx"):
            continue
        outs_int = all(
            o in types and types[o].type.tensor_type.elem_type in _INT_TYPES for o in node.output
        )
        sources_ok = all(
            not n
            or n in producer
            or n in initializers
            or (n in graph_inputs and (node.op_type == "Shape" or _is_int(types, n)))
            for n in node.input
        )
        if outs_int and sources_ok:
            for o in node.output:
                producer[o] = node
    result = []
    for group in groups:
        produced = {o for n in group for o in n.output}
        pulled: list[onnx.NodeProto] = []
        for node in group:
            for name in node.input:
                _pull(name, producer, produced, pulled)
        result.append(pulled + [n for n in group if n not in pulled])
    return result


def _pull(
    name: str,
    producer: dict[str, onnx.NodeProto],
    produced: set[str],
    pulled: list[onnx.NodeProto],
) -> None:
    """Append the producers of ``name`` not yet in the segment to ``pulled``, inputs first."""
    node = producer.get(name)
    if node is None or name in produced:
        return
    for n in node.input:
        _pull(n, producer, produced, pulled)
    if not any(o in produced for o in node.output):
        pulled.append(node)
        produced.update(node.output)


def _is_int(types: dict[str, onnx.ValueInfoProto], name: str) -> bool:
    return name in types and types[name].type.tensor_type.elem_type in _INT_TYPES


def _typed(types: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    if name not in types or not types[name].type.HasField("tensor_type"):
        raise ValueError(f"tensor {name!r} crosses a segment boundary but has no inferred type")
    info = onnx.ValueInfoProto()
    info.CopyFrom(types[name])
    return info
