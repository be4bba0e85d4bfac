"""TensorRT lint of the graph's structure and operators (see ``lint.py``): opsets, node order,
operators against TensorRT's ONNX support table (``support_table.py``), shape inputs computed
from tensor data."""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.compiler.backends.tensorrt import support_table as st
from llmc.compiler.backends.tensorrt.lint_view import Finding, GraphView, node_finding
from llmc.compiler.quantize.microscaling_graph import TRT_DOMAIN
from llmc.engine.plugin import DOMAIN


def check_opsets(model: onnx.ModelProto) -> list[Finding]:
    """An error for each default-domain opset outside the parser's range
    (``support_table.OPSET_MIN``..``OPSET_MAX``) and each custom domain other than llmc's
    plugin and TensorRT's own ``trt`` (its ops: ``lint_microscaling``)."""
    out = []
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and not st.OPSET_MIN <= o.version <= st.OPSET_MAX:
            out.append(
                Finding(
                    "error",
                    "opset",
                    None,
                    None,
                    f"default-domain opset {o.version} is outside the parser's range "
                    f"{st.OPSET_MIN}-{st.OPSET_MAX}",
                )
            )
        elif o.domain not in ("", "ai.onnx", DOMAIN, TRT_DOMAIN):
            msg = f"opset domain {o.domain!r}: TensorRT has no importer or llmc plugin for it"
            out.append(Finding("error", "opset", None, None, msg))
    return out


def check_order(model: onnx.ModelProto) -> list[Finding]:
    """Every node input is a graph input, an initializer or an earlier node's output (ONNX
    graphs are topologically sorted; the parser imports nodes in order)."""
    g = model.graph
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    produced_later = {o for n in g.node for o in n.output}
    out = []
    for n in g.node:
        for i in n.input:
            if i not in defined:
                why = "is produced by a later node" if i in produced_later else "is never produced"
                out.append(node_finding(n)("graph", f"input {i!r} {why} (graph not sorted)"))
        defined.update(n.output)
    return out


def _data_input(n: onnx.NodeProto) -> str | None:
    index = 1 if n.op_type == "Where" else 0
    return n.input[index] if len(n.input) > index and n.input[index] else None


def check_ops(view: GraphView) -> list[Finding]:
    """Findings for standard-domain nodes: ops missing from TensorRT's ONNX parser table, and
    the attributes and input types the table restricts (plugin nodes: ``lint_plugin``)."""
    out = []
    for n in view.model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue  # plugins: lint_plugin
        err = node_finding(n)
        if n.op_type in st.UNSUPPORTED:
            out.append(err("op", f"marked unsupported (N) in {st.SOURCE}"))
            continue
        supported = st.SUPPORTED.get(n.op_type)
        if supported is None:
            out.append(err("op", f"not in TensorRT's ONNX operator table ({st.SOURCE})"))
            continue
        data = _data_input(n)
        tname = view.type_name(data) if data else None
        if tname and tname not in supported:
            out.append(
                err(
                    "op",
                    f"input {data!r} is {tname}; TensorRT supports {n.op_type} on "
                    f"{', '.join(sorted(supported))}",
                )
            )
        if n.op_type == "Cast":
            to = st.TYPE_NAMES.get(helper.get_attribute_value(n.attribute[0]), "?")
            if to not in supported:
                out.append(err("op", f"casts to {to}; TensorRT casts only to {sorted(supported)}"))
        for i in st.CONSTANT_INPUTS.get(n.op_type, ()):
            if i < len(n.input) and n.input[i] and not view.is_constant(n.input[i]):
                out.append(err("op", f"input {i} ({n.input[i]!r}) must be a build-time constant"))
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        for name, allowed in st.ATTRIBUTE_RULES.get(n.op_type, ()):
            if name in attrs and attrs[name] not in allowed:
                out.append(err("op", f"attribute {name}={attrs[name]!r} is unsupported"))
        if n.op_type == "Constant" and not {
            "value",
            "value_int",
            "value_ints",
            "value_float",
            "value_floats",
        } >= set(attrs):
            out.append(err("op", f"attribute {sorted(attrs)} unsupported (sparse or string)"))
    return out


def check_shape_inputs(view: GraphView) -> list[Finding]:
    """Shape inputs must not depend on tensor data. ``origin[v]`` is where v's data comes from."""
    g = view.model.graph
    inits = set(view.initializers)
    origin = {i.name: f"graph input {i.name!r}" for i in g.input if i.name not in inits}
    out = []
    for n in g.node:
        for i in st.SHAPE_INPUTS.get(n.op_type, ()):
            if i < len(n.input) and n.input[i] in origin:
                out.append(
                    node_finding(n)(
                        "shape",
                        f"input {i} ({n.input[i]!r}) sets an output shape but is computed "
                        f"from tensor data ({origin[n.input[i]]}); TensorRT needs shape inputs "
                        "computable from tensor shapes and constants",
                    )
                )
        if n.op_type in st.DATA_DEPENDENT:
            for o in n.output:
                origin[o] = f"{n.op_type} node {n.name!r} output (data-dependent shape)"
        elif n.op_type not in ("Shape", "Size"):
            source = next((origin[i] for i in n.input if i in origin), None)
            if source is not None:
                origin.update(dict.fromkeys(n.output, source))
    return out
