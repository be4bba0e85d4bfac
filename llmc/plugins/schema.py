"""ONNX schema of the ``llmc::PagedAttention`` plugin op (DESIGN §3).

onnxscript resolves a custom-domain op only through a registered schema, and TensorRT's parser
finds the plugin by op type plus the ``plugin_namespace``/``plugin_version`` attributes.
"""

from __future__ import annotations

import onnx
from onnx import defs, helper

DOMAIN = "llmc"
OP_TYPE = "PagedAttention"
PLUGIN_VERSION = "1"
SCHEMA_VERSION = 1

#: Attributes every PagedAttention node must carry (the TensorRT lint checks this list).
REQUIRED_ATTRIBUTES = (
    "plugin_namespace",
    "plugin_version",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "scale",
    "sliding_window",
    "logit_softcap",
    "block_size",
    "layer_idx",
)

#: Values of the optional ``kv_cache_dtype`` attribute (``--kv-cache-dtype``): "auto" keeps the
#: cache in the compute dtype (float32 on the CPU); "fp8" is FP8 E4M3FN (OCP 8-bit floating point
#: spec, max 448); "int8" is symmetric int8 (zero point 0, [-127, 127]). A quantized cache holds
#: ``saturate(round_half_even(x / scale))`` and is read as ``float(q) * scale``, with the
#: per-layer, per-tensor float scales ``k_scale`` and ``v_scale`` (vLLM's; default 1.0).
KV_CACHE_DTYPES = ("auto", "fp8", "int8")

#: The optional attributes and their defaults (a node without them has an "auto" cache).
OPTIONAL_ATTRIBUTES = {"kv_cache_dtype": "auto", "k_scale": 1.0, "v_scale": 1.0}

#: Input names in order (DESIGN §3).
INPUTS = (
    "q",
    "k",
    "v",
    "key_cache",
    "value_cache",
    "seq_lens",
    "query_start_loc",
    "block_tables",
    "slot_mapping",
)


def _schema() -> defs.OpSchema:
    attr = defs.OpSchema.Attribute
    t = defs.OpSchema.AttrType
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    inputs = [
        defs.OpSchema.FormalParameter("q", "T", "[T, num_heads * head_dim]"),
        defs.OpSchema.FormalParameter("k", "T", "[T, num_kv_heads * head_dim]"),
        defs.OpSchema.FormalParameter("v", "T", "[T, num_kv_heads * head_dim]"),
        defs.OpSchema.FormalParameter("key_cache", "C", "[num_blocks, block_size, KVH, D]"),
        defs.OpSchema.FormalParameter("value_cache", "C", "[num_blocks, block_size, KVH, D]"),
        defs.OpSchema.FormalParameter("seq_lens", "tensor(int32)", "[B]"),
        defs.OpSchema.FormalParameter("query_start_loc", "tensor(int32)", "[B+1]"),
        defs.OpSchema.FormalParameter("block_tables", "tensor(int32)", "[B, max_blocks]"),
        defs.OpSchema.FormalParameter("slot_mapping", "tensor(int64)", "[T]"),
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
            attr("num_heads", t.INT, "query heads H"),
            attr("num_kv_heads", t.INT, "key/value heads KVH (GQA/MQA when < H)"),
            attr("head_dim", t.INT, "D"),
            attr("scale", t.FLOAT, "softmax scale applied to q.k"),
            attr("sliding_window", t.INT, "window in tokens including self; 0 = none"),
            attr("logit_softcap", t.FLOAT, "c in c*tanh(s/c); 0 = none"),
            attr("block_size", t.INT, "tokens per KV block"),
            attr("layer_idx", t.INT, "decoder layer index"),
            *(
                attr(name, helper.make_attribute(name, OPTIONAL_ATTRIBUTES[name]), doc)
                for name, doc in (
                    ("kv_cache_dtype", "KV cache dtype: 'auto' (compute dtype), 'fp8', 'int8'"),
                    ("k_scale", "key cache scale: key = float(code) * k_scale"),
                    ("v_scale", "value cache scale: value = float(code) * v_scale"),
                )
            ),
        ],
    )


def register_schema() -> None:
    """Register the schema with ONNX once per process (idempotent)."""
    if not defs.has(OP_TYPE, DOMAIN):
        defs.register_schema(_schema())


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The PagedAttention nodes of ``model``'s main graph, in graph order."""
    return [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]
