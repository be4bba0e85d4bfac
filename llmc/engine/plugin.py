"""The ``llmc::PagedAttention`` plugin contract (DESIGN §3): its name, inputs and attributes.

``PluginAttributes`` is the one definition of the attributes. The ONNX schema
(``llmc.plugins.schema``), the execution plan's ``PluginCall`` (``llmc.engine.plan``), the
TensorRT plugin and its lint (``llmc.plugins.paged_attention.trt_plugin``,
``llmc.compiler.tensorrt``) read the names, types, defaults and docs from its fields; the CPU
kernel and the Triton launcher take ``kernel_arguments()``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

import onnx
from onnx import helper

from llmc.engine.kv_cache import KV_CACHE_DTYPES
from llmc.errors import LlmcError

DOMAIN = "llmc"
OP_TYPE = "PagedAttention"
PLUGIN_ID = f"{DOMAIN}::{OP_TYPE}"
PLUGIN_VERSION = "1"
SCHEMA_VERSION = 1

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


def _attribute(doc: str, **default) -> object:
    return field(metadata={"doc": doc}, **default)


@dataclass(frozen=True)
class PluginAttributes:
    """One PagedAttention node's attributes, in the order TensorRT's plugin declares them.

    ``kv_cache_dtype``, ``k_scale`` and ``v_scale`` are optional (a node without them has an
    "auto" cache): ``kv_cache_dtype`` is one of ``KV_CACHE_DTYPES`` ("auto" keeps the cache in
    the compute dtype, "fp8" is FP8 E4M3FN, "int8" symmetric int8); a quantized cache holds
    ``saturate(round_half_even(x / scale))`` and is read as ``float(q) * scale`` with the
    per-layer, per-tensor scales ``k_scale`` and ``v_scale`` (vLLM's).
    """

    num_heads: int = _attribute("query heads H")
    num_kv_heads: int = _attribute("key/value heads KVH (GQA/MQA when < H)")
    head_dim: int = _attribute("D")
    scale: float = _attribute("softmax scale applied to q.k")
    sliding_window: int = _attribute("window in tokens including self; 0 = none")
    logit_softcap: float = _attribute("c in c*tanh(s/c); 0 = none")
    block_size: int = _attribute("tokens per KV block")
    layer_idx: int = _attribute("decoder layer index")
    kv_cache_dtype: str = _attribute(
        "KV cache dtype: 'auto' (compute dtype), 'fp8', 'int8'", default="auto"
    )
    k_scale: float = _attribute("key cache scale: key = float(code) * k_scale", default=1.0)
    v_scale: float = _attribute("value cache scale: value = float(code) * v_scale", default=1.0)

    @classmethod
    def from_node(cls, node: onnx.NodeProto) -> PluginAttributes:
        """Read a node, the optional attributes defaulted.

        Raises:
            LlmcError: a required attribute is missing, or a value is invalid (``check``).
        """
        attributes = cls(**node_attribute_values(node))
        attributes.check()
        return attributes

    @classmethod
    def from_fields(cls, *values) -> PluginAttributes:
        """The attributes as TensorRT hands them to the plugin, in field order; string fields
        may end in NULs (onnx-tensorrt ``copyField(std::string)`` appends one and QDP keeps it),
        which are stripped. Raises LlmcError like :meth:`check`."""
        if len(values) != len(PLUGIN_ATTRIBUTES):
            raise LlmcError(f"PagedAttention takes {len(PLUGIN_ATTRIBUTES)} attributes")
        converted = {
            name: kind(value.rstrip("\x00") if isinstance(value, str) else value)
            for (name, kind), value in zip(PLUGIN_ATTRIBUTES, values, strict=True)
        }
        attributes = cls(**converted)
        attributes.check()
        return attributes

    def check(self) -> None:
        """Raise LlmcError unless the head counts and the cache dtype are ones the kernels run."""
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise LlmcError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise LlmcError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )

    def node_attributes(self) -> dict[str, object]:
        """Every attribute in field order, for a node (the TensorRT lowering writes them all)."""
        return {name: getattr(self, name) for name, _ in PLUGIN_ATTRIBUTES}

    def kernel_arguments(self) -> dict[str, object]:
        """The keyword arguments of the CPU kernel (``paged_attention_cpu``), the Triton
        launcher (``paged_attention_triton``) and the torch reference: the head geometry, the
        scale, the window and the softcap (None for 0 = none), the cache scales."""
        return {
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "scale": self.scale,
            "sliding_window": self.sliding_window or None,
            "logit_softcap": self.logit_softcap or None,
            "k_scale": self.k_scale,
            "v_scale": self.v_scale,
        }


_TYPES = {"int": int, "float": float, "str": str}

#: The plugin's attributes in the descriptor's order, with their Python types.
PLUGIN_ATTRIBUTES: tuple[tuple[str, type], ...] = tuple(
    (f.name, _TYPES[f.type]) for f in fields(PluginAttributes)
)

#: The optional attributes and their defaults.
OPTIONAL_ATTRIBUTES: dict[str, object] = {
    f.name: f.default for f in fields(PluginAttributes) if f.default is not MISSING
}

#: What each attribute means (the ONNX schema's docs).
ATTRIBUTE_DOCS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(PluginAttributes)}

#: Attributes every PagedAttention node must carry (the TensorRT lint checks this list): the
#: TensorRT plugin lookup's two, then every attribute without a default.
REQUIRED_ATTRIBUTES: tuple[str, ...] = (
    "plugin_namespace",
    "plugin_version",
    *(name for name, _ in PLUGIN_ATTRIBUTES if name not in OPTIONAL_ATTRIBUTES),
)


def node_attribute_values(node: onnx.NodeProto) -> dict[str, object]:
    """The plugin attributes of a node, converted to their types, the optional ones defaulted.
    Raises LlmcError naming any required attribute the node lacks."""
    values = dict(OPTIONAL_ATTRIBUTES)
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    missing = [name for name, _ in PLUGIN_ATTRIBUTES if name not in values]
    if missing:
        raise LlmcError(
            f"PagedAttention node {node.name!r} lacks attribute(s) {', '.join(missing)}; "
            "re-export the model with this llmc version"
        )
    return {name: kind(values[name]) for name, kind in PLUGIN_ATTRIBUTES}


def is_plugin_node(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a PagedAttention node."""
    return node.domain == DOMAIN and node.op_type == OP_TYPE


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The PagedAttention nodes of ``model``'s main graph, in graph order."""
    return [n for n in model.graph.node if is_plugin_node(n)]
