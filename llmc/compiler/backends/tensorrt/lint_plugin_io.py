"""TensorRT lint of how each ``llmc::PagedAttention`` node meets the TensorRT plugin (see
``lint.py``). One rule per class of defect, each with the source it comes from (read in
NVIDIA/TensorRT v11.1 and onnx/onnx-tensorrt; ``trt_plugin.py`` quotes them):

- ``outputs``: the node has as many outputs as the plugin declares;
- ``alias``: the aliased cache outputs are graph outputs, bound by name to the caches;
- ``aot``: the node picks the AOT or the JIT implementation;
- ``fields``: the node carries every plugin attribute;
- ``strings``: the plugin reads its string fields as the parser delivers them (NUL-terminated).
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.compiler.backends.tensorrt.lint_view import Finding, GraphView, node_finding
from llmc.engine.plugin import PLUGIN_ATTRIBUTES, PluginAttributes, plugin_nodes
from llmc.errors import LlmcError
from llmc.plugins.paged_attention.trt_plugin import (
    ALIASED_INPUTS,
    AOT_ATTRIBUTE,
    OUTPUTS,
    aliased_output_name,
)


def check_plugin_io(view: GraphView) -> list[Finding]:
    """Findings for every PagedAttention node of ``view``."""
    g = view.model.graph
    graph_inputs = {i.name: i for i in g.input}
    graph_outputs = {o.name: o for o in g.output}
    out: list[Finding] = []
    for n in plugin_nodes(view.model):
        err, warn = node_finding(n), node_finding(n, "warning")
        out += _outputs(n, err)
        out += _aliases(n, graph_inputs, graph_outputs, err)
        out += _aot(n, err, warn)
        out += _fields(n, err)
        out += _strings(n, err)
    return out


def _outputs(n: onnx.NodeProto, err) -> list[Finding]:
    # onnx-tensorrt ModelImporter.cpp, parseNode: the node's non-empty outputs must number the
    # layer's outputs, else "Node has more output tensors than TRT expected" (kINVALID_GRAPH);
    # the plugin declares OUTPUTS (trt_register.py: q.like(), key_cache.aliased(),
    # value_cache.aliased()).
    count = sum(bool(o) for o in n.output)
    if count == len(OUTPUTS):
        return []
    return [
        err(
            "outputs",
            f"has {count} outputs but the TensorRT plugin declares {len(OUTPUTS)} "
            f"({', '.join(OUTPUTS)}); TensorRT's ONNX parser stops at an output-count mismatch",
        )
    ]


def _aliases(n: onnx.NodeProto, graph_inputs: dict, graph_outputs: dict, err) -> list[Finding]:
    # NvInferRuntime.h v11.1, IPluginV3OneBuildV2::getAliasedInput (read-modify-write; TensorRT
    # "may insert copies"), and the in-place QDP sample (qdp_runner.py, run_inplace_add): the
    # aliased output is a network output bound to its input's memory, so the runner's cache is
    # the buffer the plugin writes. The runner finds it by aliased_output_name.
    out = []
    for out_index, in_index in ALIASED_INPUTS.items():
        if len(n.input) <= in_index:
            continue  # wrong input count: reported under "plugin"
        cache = n.input[in_index]
        name = n.output[out_index] if len(n.output) > out_index else ""
        wanted = aliased_output_name(cache)
        if not name:
            continue  # reported under "outputs"
        if cache not in graph_inputs:
            out.append(err("alias", f"cache {cache!r} is not a graph input the runner can bind"))
        elif name != wanted:
            out.append(err("alias", f"output {out_index} is {name!r}; the runner binds {wanted!r}"))
        elif name not in graph_outputs:
            out.append(
                err(
                    "alias",
                    f"output {name!r} aliases cache {cache!r} but is not a graph output: "
                    "TensorRT must bind it to the cache's memory, or the cache is never written",
                )
            )
        else:
            got = graph_outputs[name].type.tensor_type.elem_type
            want = graph_inputs[cache].type.tensor_type.elem_type
            if got != want:
                out.append(err("alias", f"output {name!r} has element type {got}, cache {want}"))
    return out


def _aot(n: onnx.NodeProto, err, warn) -> list[Finding]:
    # onnx-tensorrt importerUtils.cpp, createPlugin (V3Quick): a node attribute "aot" asks for
    # kSTRICT_AOT/kSTRICT_JIT; without it, the PREFER_*_PYTHON_PLUGINS network flags, else
    # kUNKNOWN, and tensorrt/plugin/_lib.py create_plugin raises "has both AOT and JIT
    # implementations" (trt_register.py registers both).
    attr = next((a for a in n.attribute if a.name == AOT_ATTRIBUTE), None)
    if attr is None:
        return [
            err(
                "aot",
                f"has no {AOT_ATTRIBUTE!r} attribute: the plugin has both AOT and JIT "
                "implementations and TensorRT refuses to choose",
            )
        ]
    if attr.type != onnx.AttributeProto.INT:
        return [err("aot", f"attribute {AOT_ATTRIBUTE!r} must be an int (1 = AOT, 0 = JIT)")]
    if attr.i == 0:
        return [warn("aot", "aot=0 (JIT): the engine calls Python, torch and Triton each step")]
    return []


def _fields(n: onnx.NodeProto, err) -> list[Finding]:
    # onnx-tensorrt onnxOpImporters.cpp, loadFields: an attribute the node lacks is skipped
    # ("Ensure that the plugin creator has a default value"); QDP attributes have no defaults
    # (tensorrt/plugin/_validate.py), so the plugin would be called without it.
    names = {a.name for a in n.attribute}
    missing = [name for name, _ in PLUGIN_ATTRIBUTES if name not in names]
    if not missing:
        return []
    return [err("fields", f"lacks plugin field(s) {', '.join(missing)} (QDP has no defaults)")]


def _strings(n: onnx.NodeProto, err) -> list[Finding]:
    # onnx-tensorrt onnxOpImporters.cpp, copyField(std::string): a STRING attribute arrives
    # with a NUL appended ("end of C style string"); tensorrt/plugin/_lib.py create_plugin
    # decodes f.data.tobytes() whole. Each string field is run through the plugin's own parser
    # (PluginAttributes.from_fields) in that form and must read back unchanged.
    names = dict(PLUGIN_ATTRIBUTES)
    strings = [a for a in n.attribute if a.type == onnx.AttributeProto.STRING and a.name in names]
    if not strings:
        return []
    try:
        clean = PluginAttributes.from_node(n)
    except LlmcError:
        return []  # invalid attributes: reported under "plugin"
    values = clean.node_attributes()
    out = []
    for a in strings:
        arrived = (helper.get_attribute_value(a) + b"\x00").decode("utf-8")
        try:
            fields = (values | {a.name: arrived}).values()
            read = getattr(PluginAttributes.from_fields(*fields), a.name)
            problem = None if read == values[a.name] else repr(read)
        except LlmcError as e:
            problem = str(e)
        if problem is not None:
            out.append(
                err(
                    "strings",
                    f"string field {a.name}={values[a.name]!r} reaches the plugin as "
                    f"{arrived!r} (TensorRT's parser appends a NUL) and the plugin reads "
                    f"{problem}",
                )
            )
    return out
