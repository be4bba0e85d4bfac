"""ONNX schema of the ``llmc::PagedAttention`` plugin op (DESIGN §3).

onnxscript resolves a custom-domain op only through a registered schema, and TensorRT's parser
finds the plugin by op type plus the ``plugin_namespace``/``plugin_version`` attributes. The
attributes are ``llmc.engine.plugin.PluginAttributes``'s fields, plus the CPU kernel's optional
``FPMATH_ATTRIBUTE``.
"""

from __future__ import annotations

from onnx import defs, helper

from llmc.engine.plugin import (
    ATTRIBUTE_DOCS,
    DOMAIN,
    FPMATH_ATTRIBUTE,
    INPUTS,
    OP_TYPE,
    OPTIONAL_ATTRIBUTES,
    PLUGIN_ATTRIBUTES,
    SCHEMA_VERSION,
)

FPMATH_DOC = (
    "CPU kernel only: 'strict' float32; 'bf16' lets prefill tiles round q, k, v and the softmax "
    "weights to bfloat16 on AMX-BF16 hosts"
)

_ATTRIBUTE_TYPES = {
    int: defs.OpSchema.AttrType.INT,
    float: defs.OpSchema.AttrType.FLOAT,
    str: defs.OpSchema.AttrType.STRING,
}


#: Type constraint and shape of each input, in ``INPUTS`` order.
_INPUT_TYPES = (
    ("T", "[T, num_heads * head_dim]"),
    ("T", "[T, num_kv_heads * head_dim]"),
    ("T", "[T, num_kv_heads * head_dim]"),
    ("C", "[num_blocks, block_size, KVH, D]"),
    ("C", "[num_blocks, block_size, KVH, D]"),
    ("tensor(int32)", "[B]"),
    ("tensor(int32)", "[B+1]"),
    ("tensor(int32)", "[B, max_blocks]"),
    ("tensor(int64)", "[T]"),
)


def _schema() -> defs.OpSchema:
    attr = defs.OpSchema.Attribute
    t = defs.OpSchema.AttrType
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    inputs = [
        defs.OpSchema.FormalParameter(name, kind, shape)
        for name, (kind, shape) in zip(INPUTS, _INPUT_TYPES, strict=True)
    ]
    return defs.OpSchema(
        OP_TYPE,
        DOMAIN,
        SCHEMA_VERSION,
        doc="Paged attention over packed ragged tokens; writes k/v to the cache in place.",
        inputs=inputs,
        outputs=[defs.OpSchema.FormalParameter("output", "T", "[T, num_heads * head_dim]")],
        type_constraints=[
            ("T", floats, "activations"),
            ("C", [*floats, "tensor(float8e4m3fn)", "tensor(int8)"], "KV cache"),
        ],
        attributes=[
            attr("plugin_namespace", t.STRING, "TensorRT plugin namespace, 'llmc'"),
            attr("plugin_version", t.STRING, "TensorRT plugin version"),
            *(
                attr(name, helper.make_attribute(name, OPTIONAL_ATTRIBUTES[name]), doc)
                if name in OPTIONAL_ATTRIBUTES
                else attr(name, _ATTRIBUTE_TYPES[kind], doc)
                for (name, kind), doc in zip(
                    PLUGIN_ATTRIBUTES, ATTRIBUTE_DOCS.values(), strict=True
                )
            ),
            attr(FPMATH_ATTRIBUTE, helper.make_attribute(FPMATH_ATTRIBUTE, "strict"), FPMATH_DOC),
        ],
    )


def register_schema() -> None:
    """Register the schema with ONNX once per process (idempotent)."""
    if not defs.has(OP_TYPE, DOMAIN):
        defs.register_schema(_schema())
