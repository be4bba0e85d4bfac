"""Every signature of ``llmc::PagedAttention`` is derived from its one definition
(``llmc.engine.plugin``: ``PluginInputs`` and ``PluginAttributes``): the ONNX schema, the plan's
``PluginCall``, the torch op and its ONNX translation (``with_node_signature``), the kernels'
calling convention (``plugin_kernel``), the Triton kernels' pointer parameters. TensorRT's
``@trtp.register`` reads its schema from Python source, so the TensorRT plugin's functions are
written out; this test keeps them equal to the definition."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields
from inspect import Parameter
from pathlib import Path

import pytest
from onnx import defs

from llmc.engine.plan import PluginCall
from llmc.engine.plugin import (
    DOMAIN,
    EXPORTED_ATTRIBUTES,
    FPMATH_ATTRIBUTE,
    INPUTS,
    KERNEL_ARGUMENTS,
    OP_TYPE,
    OPTIONAL_ATTRIBUTES,
    PLUGIN_ATTRIBUTES,
    REQUIRED_ATTRIBUTES,
    SCHEMA_VERSION,
    PluginAttributes,
    PluginInputs,
    bind_node_call,
    node_call,
    plugin_kernel,
)
from llmc.plugins import schema
from llmc.plugins.paged_attention import cpu, reference, triton_launch, trt_register

NAMES = [name for name, _ in PLUGIN_ATTRIBUTES]
GEMMA = PluginAttributes(4, 1, 256, 0.0625, 512, 0.0, 16, 3)
TENSORS = PluginInputs(*(f"tensor {i}" for i in range(len(INPUTS))))


def test_schema_is_the_definition() -> None:
    schema.register_schema()
    op = defs.get_schema(OP_TYPE, SCHEMA_VERSION, DOMAIN)
    assert [i.name for i in op.inputs] == list(INPUTS)
    assert set(op.attributes) == {*REQUIRED_ATTRIBUTES, *OPTIONAL_ATTRIBUTES, FPMATH_ATTRIBUTE}
    assert {name for name in op.attributes if op.attributes[name].required} == set(
        REQUIRED_ATTRIBUTES
    )


def test_plan_call_is_the_attributes_and_its_tensors() -> None:
    assert [f.name for f in fields(PluginCall)] == [*NAMES, "inputs", "output", FPMATH_ATTRIBUTE]


def test_the_exported_attributes_are_the_required_ones_and_lead_the_fields() -> None:
    assert list(EXPORTED_ATTRIBUTES) == NAMES[: len(EXPORTED_ATTRIBUTES)]
    assert list(REQUIRED_ATTRIBUTES) == ["plugin_namespace", "plugin_version", *EXPORTED_ATTRIBUTES]
    assert not set(EXPORTED_ATTRIBUTES) & set(OPTIONAL_ATTRIBUTES)


def test_a_node_call_binds_back_to_its_inputs_and_attributes() -> None:
    arguments = node_call(TENSORS, GEMMA)
    assert arguments == (*TENSORS, 4, 1, 256, 0.0625, 512, 0.0, 16, 3)
    assert bind_node_call(arguments, {}) == (TENSORS, GEMMA)
    keywords = dict(zip(EXPORTED_ATTRIBUTES, arguments[len(INPUTS) :], strict=True))
    assert bind_node_call(arguments[: len(INPUTS)], keywords) == (TENSORS, GEMMA)
    with pytest.raises(TypeError):
        bind_node_call(arguments[:-1], {})


def test_torch_op_and_its_onnx_translation_take_the_inputs_then_the_exported_attributes() -> None:
    pytest.importorskip("onnxscript")
    from llmc.compiler.frontend.attention import paged_attention_op
    from llmc.compiler.frontend.onnx_export import _translation

    kinds = dict(PLUGIN_ATTRIBUTES)
    arguments = paged_attention_op._opoverload._schema.arguments
    assert [(a.name, str(a.type)) for a in arguments] == [
        *((name, "Tensor") for name in INPUTS),
        *((name, kinds[name].__name__) for name in EXPORTED_ATTRIBUTES),
    ]
    assert not any(a.is_out or a.alias_info for a in arguments)  # no functionalized cache copy
    translation = inspect.signature(_translation())
    assert list(translation.parameters) == [*INPUTS, *EXPORTED_ATTRIBUTES]
    # The exporter treats an unannotated parameter as an input, an annotated one as an attribute.
    assert {name: p.annotation for name, p in translation.parameters.items()} == {
        **dict.fromkeys(INPUTS, Parameter.empty),
        **{name: kinds[name] for name in EXPORTED_ATTRIBUTES},
    }


def test_kernel_arguments_leave_out_what_the_caches_say_and_zero_means_none() -> None:
    assert set(NAMES) - set(KERNEL_ARGUMENTS) == {"block_size", "layer_idx", "kv_cache_dtype"}
    assert GEMMA.kernel_arguments() == {
        "num_heads": 4,
        "num_kv_heads": 1,
        "head_dim": 256,
        "scale": 0.0625,
        "sliding_window": 512,
        "logit_softcap": None,
        "k_scale": 1.0,
        "v_scale": 1.0,
    }
    no_window = PluginAttributes(4, 1, 256, 0.0625, 0, 30.0, 16, 3)
    assert no_window.kernel_arguments()["sliding_window"] is None
    assert no_window.kernel_arguments()["logit_softcap"] == 30.0


KERNELS = [
    cpu.paged_attention_cpu,
    reference.paged_attention_reference,
    triton_launch.paged_attention_triton,  # imports triton only when it launches
]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_kernels_take_the_inputs_then_the_kernel_arguments(kernel) -> None:
    parameters = list(inspect.signature(kernel).parameters.values())
    inputs = parameters[: len(INPUTS)]
    arguments = parameters[len(INPUTS) : len(INPUTS) + len(KERNEL_ARGUMENTS)]
    assert [(p.name, p.kind) for p in inputs] == [(n, Parameter.POSITIONAL_ONLY) for n in INPUTS]
    assert [(p.name, p.kind) for p in arguments] == [
        (name, Parameter.KEYWORD_ONLY) for name in KERNEL_ARGUMENTS
    ]
    assert {p.name: p.default for p in arguments if p.default is not p.empty} == {
        name: OPTIONAL_ATTRIBUTES[name] for name in KERNEL_ARGUMENTS if name in OPTIONAL_ATTRIBUTES
    }


def test_plugin_kernel_hands_the_implementation_what_the_caller_passed() -> None:
    @plugin_kernel
    def probe(inputs, arguments, *, option: int = 0):
        return inputs, arguments, option

    inputs, arguments, option = probe(*TENSORS, **GEMMA.kernel_arguments(), option=7)
    assert inputs == TENSORS and inputs.slot_mapping == TENSORS[-1]
    assert arguments._asdict() == GEMMA.kernel_arguments()
    assert option == 7
    defaulted = dict(GEMMA.kernel_arguments())
    del defaulted["k_scale"], defaulted["v_scale"]
    assert probe(*TENSORS, **defaulted)[1]._asdict() == GEMMA.kernel_arguments()
    del defaulted["num_heads"]
    with pytest.raises(TypeError, match="num_heads"):
        probe(*TENSORS, **defaulted)
    with pytest.raises(TypeError):
        probe(*TENSORS[:-1], **GEMMA.kernel_arguments())
    with pytest.raises(TypeError, match="keyword-only"):
        plugin_kernel(lambda inputs, arguments, option: None)


def test_triton_kernels_take_the_inputs_as_their_leading_pointers() -> None:
    pytest.importorskip("triton")
    from llmc.plugins.paged_attention import triton_flash_decoding, triton_kernel

    def names(kernel) -> list[str]:
        return list(inspect.signature(kernel.fn).parameters)

    pointers = [f"{name}_ptr" for name in INPUTS]
    assert list(triton_kernel.POINTER_INPUTS) == pointers
    runtime = [
        *triton_kernel.POINTER_INPUTS,
        *triton_kernel.SCALAR_INPUTS,
        *triton_kernel.POINTER_OUTPUTS,
    ]
    assert names(triton_kernel.paged_attention_kernel)[: len(runtime)] == runtime
    # The launcher passes the split kernel every input but slot_mapping.
    split = names(triton_flash_decoding.flash_decoding_split_kernel)
    assert split[: len(INPUTS) - 1] == [p for p in pointers if p != "slot_mapping_ptr"]


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
