"""Join a CPU engine's optimized segments and its plugin nodes back into one graph.

The segments (``llmc.engine.split``) are what ORT optimized for this host; joined in plan order
with a ``llmc::PagedAttention`` node between each pair, they make ``engine.onnx``: the whole step as
one ORT run, with the plugin as ORT custom op (``llmc/plugins/paged_attention/ort_op.c``). The
joined graph adds no weights: its initializers point into the segments' external data files.
Why a join of optimized segments rather than optimizing the whole graph: the runner can then
run either form of one engine (the segments when the custom op is not built) on identical
optimized nodes, so the two agree bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from llmc.engine.kv_cache import onnx_cache_type
from llmc.engine.plan import ExecutionPlan, PluginCall
from llmc.engine.plugin import DOMAIN, OP_TYPE, PLUGIN_VERSION, SCHEMA_VERSION

GRAPH_FILE = "engine.onnx"

# Element types and shapes of the plugin's metadata inputs (``llmc.plugins.schema``).
_METADATA = (
    (onnx.TensorProto.INT32, ["num_seqs"]),
    (onnx.TensorProto.INT32, ["num_seqs_plus_1"]),
    (onnx.TensorProto.INT32, ["num_seqs", "max_blocks_per_seq"]),
    (onnx.TensorProto.INT64, ["num_tokens"]),
)


def _plugin_node(p: PluginCall) -> onnx.NodeProto:
    return helper.make_node(
        OP_TYPE,
        p.inputs,
        [p.output],
        name=f"paged_attention_{p.layer_idx}",
        domain=DOMAIN,
        plugin_namespace=DOMAIN,
        plugin_version=PLUGIN_VERSION,
        **p.cpu_node_attributes(),
    )


def _is_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def write_single_graph(engine_dir: Path, plan: ExecutionPlan) -> str:
    """Write ``engine_dir / GRAPH_FILE`` from the plan's saved segments; return its name.

    A tensor that several segments compute under one name (shape arithmetic ``llmc.engine.split``
    copies into each) is renamed in the later ones. An initializer that two segments hold under
    one name is kept once when it is inline and the same; external data (a tied embedding table,
    read by the first segment's ``Gather`` and the last one's projection) stays two
    initializers over the same bytes: ONNX Runtime maps each external initializer on its own,
    so the projection's kernel prepacks its copy and drops the mapping, while the ``Gather``'s
    mapping is paged in only for the rows it reads. One initializer for both would keep the
    whole table resident beside the prepacked copy (measured on Gemma 3 270M's float32 engine:
    1.73 GB resident after load against 1.10 GB, ``benchmarks/RESULTS.md``).
    """
    nodes: list[onnx.NodeProto] = []
    producer: dict[str, onnx.NodeProto] = {}
    initializers: dict[str, onnx.TensorProto] = {}
    inputs: dict[str, onnx.ValueInfoProto] = {}
    opsets: dict[str, int] = {DOMAIN: SCHEMA_VERSION}
    node_names: set[str] = set()
    ir_version = 0
    last = None
    for i, spec in enumerate(plan.segments):
        seg = onnx.load(str(engine_dir / spec.file), load_external_data=False)
        last, ir_version = seg, max(ir_version, seg.ir_version)
        for o in seg.opset_import:
            opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
        folder = str(Path(spec.file).parent)
        renamed = {}
        for t in seg.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = f"{folder}/{entry.value}"
            kept = initializers.get(t.name)
            if kept is not None and not _is_external(t) and kept == t:
                continue
            if kept is not None:
                renamed[t.name] = t.name = f"{t.name}__segment{i}"
            initializers[t.name] = t
        for v in seg.graph.input:
            if v.name not in producer and v.name not in initializers:
                inputs.setdefault(v.name, v)
        # Shape arithmetic that split_at_plugins copied into several segments was optimized
        # apart in each: keep every copy, under segment-local names.
        local = {o for node in seg.graph.node for o in node.output if o in producer}
        renamed.update((name, f"{name}__segment{i}") for name in local)
        for j, node in enumerate(seg.graph.node):
            node.input[:] = [renamed.get(n, n) for n in node.input]
            node.output[:] = [renamed.get(n, n) for n in node.output]
            if node.name in node_names:
                node.name = f"{node.name}__segment{i}_{j}"
            if node.name:
                node_names.add(node.name)
            nodes.append(node)
            producer.update((o, node) for o in node.output if o)
        if i < len(plan.plugins):
            p = plan.plugins[i]
            for name, (elem, shape) in zip(p.inputs[5:], _METADATA, strict=True):
                if name not in producer:
                    inputs.setdefault(name, helper.make_tensor_value_info(name, elem, shape))
            for name in p.inputs[3:5]:
                shape = ["num_blocks", p.block_size, p.num_kv_heads, p.head_dim]
                inputs[name] = helper.make_tensor_value_info(
                    name, onnx_cache_type(p.kv_cache_dtype, onnx.TensorProto.FLOAT), shape
                )
            node = _plugin_node(p)
            nodes.append(node)
            producer[p.output] = node
    outputs = [o for o in last.graph.output if o.name == plan.logits]
    graph = helper.make_graph(
        nodes, "engine", list(inputs.values()), outputs, initializer=initializers.values()
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())]
    )
    model.ir_version = ir_version
    onnx.save(model, str(engine_dir / GRAPH_FILE))
    return GRAPH_FILE
