"""Give each ``llmc::PagedAttention`` node of a TensorRT-bound graph what the plugin declares.

The exported graph (shared with the CPU engine, whose ONNX Runtime op and segments read it as it
is) has one output per plugin node and only the attributes that differ from their defaults. The
TensorRT plugin (``llmc.plugins.paged_attention.trt_plugin``, which cites the sources) needs:

- every attribute of ``PLUGIN_ATTRIBUTES``: QDP attributes cannot have defaults, and
  onnx-tensorrt passes only the attributes a node carries (``onnxOpImporters.cpp``,
  ``loadFields``: a missing one is skipped with a warning);
- ``aot=1``: both a JIT and an AOT implementation are registered and ``create_plugin`` refuses
  to choose (``tensorrt/plugin/_lib.py``); a node-level ``aot`` is the importer's first choice
  (``importerUtils.cpp``, ``createPlugin``);
- three outputs, as the plugin declares (``ModelImporter.cpp``, ``parseNode``): the attention
  output, then the key and value caches, aliased to inputs 3 and 4 and made graph outputs named
  ``aliased_output_name(cache input)``, which the runner binds to the caches' memory (NVIDIA's
  in-place QDP sample, ``qdp_runner.py`` ``run_inplace_add``).

It also records in the model's ``metadata_props`` the PTX ISA the AOT kernel will be compiled
to (:data:`PTX_ISA_KEY`), which the lint checks against the TensorRT build's CUDA.
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.engine.plugin import PluginAttributes, plugin_nodes
from llmc.plugins.paged_attention import trt_aot
from llmc.plugins.paged_attention.trt_plugin import (
    ALIASED_INPUTS,
    AOT_ATTRIBUTE,
    aliased_output_name,
)

#: ``metadata_props`` key of the PTX ISA version ("8.7") the stage's AOT kernels are built to.
PTX_ISA_KEY = "llmc.tensorrt.ptx_isa"


def rewrite_plugin_nodes(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s PagedAttention nodes for TensorRT (in place; see the module doc) and
    record the PTX ISA. The cache graph inputs must already have their final types (the aliased
    outputs copy them). Returns how many nodes were rewritten.

    Raises:
        LlmcError: a node's attributes are invalid (``PluginAttributes.from_node``).
    """
    g = model.graph
    inputs = {vi.name: vi for vi in g.input}
    graph_outputs = {o.name for o in g.output}
    nodes = plugin_nodes(model)
    for node in nodes:
        values = PluginAttributes.from_node(node).node_attributes() | {AOT_ATTRIBUTE: 1}
        kept = [a for a in node.attribute if a.name not in values]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.extend(helper.make_attribute(k, v) for k, v in values.items())
        caches = [node.input[i] for i in ALIASED_INPUTS.values()]
        del node.output[1:]
        node.output.extend(aliased_output_name(c) for c in caches)
        for cache in caches:
            name = aliased_output_name(cache)
            if name in graph_outputs or cache not in inputs:
                continue  # not a graph input: the lint reports the alias that is no output
            out = onnx.ValueInfoProto()
            out.CopyFrom(inputs[cache])
            out.name = name
            g.output.append(out)
            graph_outputs.add(name)
    set_metadata(model, PTX_ISA_KEY, "{}.{}".format(*trt_aot.PTX_ISA))
    return len(nodes)


def set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    """Set ``model.metadata_props[key]`` (replacing an earlier value)."""
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    """``model.metadata_props`` as a dict."""
    return {p.key: p.value for p in model.metadata_props}
