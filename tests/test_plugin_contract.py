"""Every signature of ``llmc::PagedAttention`` agrees with its one definition
(``llmc.engine.plugin``): the ONNX schema, the plan's ``PluginCall``, the torch op and its ONNX
translation, the kernels' keyword arguments, the TensorRT plugin's registered functions. The torch
op, the translation and TensorRT's ``@trtp.register`` read their schemas from Python signatures,
so those are written out; this test is what keeps them equal."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields
from pathlib import Path

import pytest
from onnx import defs

from llmc.engine.plan import PluginCall
from llmc.engine.plugin import (
    DOMAIN,
    INPUTS,
    OP_TYPE,
    OPTIONAL_ATTRIBUTES,
    PLUGIN_ATTRIBUTES,
    REQUIRED_ATTRIBUTES,
    SCHEMA_VERSION,
    PluginAttributes,
)
from llmc.plugins import schema
from llmc.plugins.paged_attention import cpu, reference, trt_register

NAMES = [name for name, _ in PLUGIN_ATTRIBUTES]
#: The attributes the export writes (the quantization adds the optional ones).
EXPORTED = [name for name in NAMES if name not in OPTIONAL_ATTRIBUTES]
KERNEL = list(PluginAttributes(1, 1, 1, 1.0, 0, 0.0, 1, 0).kernel_arguments())


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_schema_is_the_definition() -> None:
    schema.register_schema()
    op = defs.get_schema(OP_TYPE, SCHEMA_VERSION, DOMAIN)
    assert [i.name for i in op.inputs] == list(INPUTS)
    assert set(op.attributes) == {*REQUIRED_ATTRIBUTES, *OPTIONAL_ATTRIBUTES}
    assert {name for name in op.attributes if op.attributes[name].required} == set(
        REQUIRED_ATTRIBUTES
    )


def test_plan_call_is_the_attributes_and_its_tensors() -> None:
    assert [f.name for f in fields(PluginCall)] == [*NAMES, "inputs", "output"]


def test_torch_op_and_its_onnx_translation_take_the_exported_attributes() -> None:
    pytest.importorskip("onnxscript")
    from llmc.compiler.attention import paged_attention_op
    from llmc.compiler.export import _translation

    assert _parameters(paged_attention_op._init_fn) == [*INPUTS, *EXPORTED]
    assert _parameters(_translation()) == [*INPUTS, *EXPORTED]


@pytest.mark.parametrize("kernel", [cpu.paged_attention_cpu, reference.paged_attention_reference])
def test_kernels_take_the_kernel_arguments(kernel) -> None:
    assert _parameters(kernel)[: len(INPUTS) + len(KERNEL)] == [*INPUTS, *KERNEL]


def test_triton_launcher_takes_the_kernel_arguments() -> None:
    pytest.importorskip("triton")
    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton

    assert _parameters(paged_attention_triton)[: len(INPUTS) + len(KERNEL)] == [*INPUTS, *KERNEL]


def test_tensorrt_plugin_functions_take_every_attribute_in_order() -> None:
    """Read from the source: registering needs TensorRT, which no machine of ours has."""
    tree = ast.parse(Path(trt_register.__file__).read_text())
    functions = {
        node.name: [a.arg for a in node.args.args]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("paged_attention_")
    }
    assert set(functions) == {
        "paged_attention_desc",
        "paged_attention_impl",
        "paged_attention_aot_impl",
    }
    for name, arguments in functions.items():
        assert arguments[: len(INPUTS) + len(NAMES)] == [*INPUTS, *NAMES], name
