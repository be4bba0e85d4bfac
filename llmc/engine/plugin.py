"""The ``llmc::PagedAttention`` plugin contract (DESIGN §3): its name, inputs and attributes.

``PluginInputs`` is the one definition of the inputs and ``PluginAttributes`` of the
attributes. The ONNX schema (``llmc.plugins.schema``), the execution plan's ``PluginCall``
(``llmc.engine.plan``), the TensorRT plugin and its lint
(``llmc.plugins.paged_attention.trt_plugin``, ``llmc.compiler.tensorrt``) read the names, types,
defaults and docs from their fields. Two signatures are built from them:
:func:`with_node_signature`'s, the node as a function (the torch custom op and its ONNX
translation), and :func:`plugin_kernel`'s, the kernels' calling convention (the torch reference,
the CPU kernel, the Triton launcher), whose keyword arguments are ``kernel_arguments()``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from inspect import Parameter
from typing import Any, NamedTuple, TypeVar

import onnx
from onnx import helper

from llmc.engine.kv_cache import KV_CACHE_DTYPES
from llmc.errors import LlmcError

DOMAIN = "llmc"
OP_TYPE = "PagedAttention"
PLUGIN_ID = f"{DOMAIN}::{OP_TYPE}"
PLUGIN_VERSION = "1"
SCHEMA_VERSION = 1

#: A node attribute outside the plugin contract, read by the CPU kernel only (the ONNX Runtime
#: op and ``PluginCall``): how much rounding it may add, oneDNN's ``fpmath_mode``. "strict"
#: (absent) computes in float32; "bf16" lets prefill tiles round q, k, v and the softmax weights
#: to bfloat16 for AMX-BF16 tiles (sums in float32) on hosts that have them. The CPU lowering
#: sets it on quantized engines, whose accuracy report is measured with it.
FPMATH_ATTRIBUTE = "fpmath_mode"
FPMATH_MODES = ("strict", "bf16")


def engine_attention_fpmath(quant: str, dtype: str) -> str:
    """The ``FPMATH_ATTRIBUTE`` a CPU engine's PagedAttention nodes get: "bf16" for a quantized
    (``quant`` not "none") or bfloat16 build, whose accuracy report then measures what the
    kernel computes, "strict" for a float32 one. The accuracy-target search scores with it."""
    return "bf16" if quant != "none" or dtype == "bfloat16" else "strict"


class PluginInputs(NamedTuple):
    """A node's inputs in order (DESIGN §3): torch tensors or numpy arrays, as the kernel at hand
    takes them. T new tokens of B sequences; H, KVH, D as in ``PluginAttributes``."""

    q: Any  # [T, H*D]
    k: Any  # [T, KVH*D]
    v: Any  # [T, KVH*D]
    key_cache: Any  # [num_blocks, block_size, KVH, D], written in place
    value_cache: Any  # [num_blocks, block_size, KVH, D], written in place
    seq_lens: Any  # [B] int32, each sequence's context length after this step
    query_start_loc: Any  # [B+1] int32, prefix sums of the new tokens
    block_tables: Any  # [B, max_blocks] int32
    slot_mapping: Any  # [T] int64, each new token's cache row


#: Input names in order (DESIGN §3).
INPUTS: tuple[str, ...] = PluginInputs._fields


def _attribute(doc: str, *, none_at_zero: bool = False, **default) -> object:
    """A ``PluginAttributes`` field; ``none_at_zero``: 0 means "none", which a kernel takes as
    None."""
    return field(metadata={"doc": doc, "none_at_zero": none_at_zero}, **default)


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
    sliding_window: int = _attribute("window in tokens including self; 0 = none", none_at_zero=True)
    logit_softcap: float = _attribute("c in c*tanh(s/c); 0 = none", none_at_zero=True)
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

    def exported_attributes(self) -> dict[str, object]:
        """The attributes an exported node carries (``EXPORTED_ATTRIBUTES``), in field order."""
        return {name: getattr(self, name) for name in EXPORTED_ATTRIBUTES}

    def kernel_arguments(self) -> dict[str, object]:
        """The keyword arguments of every kernel (``KERNEL_ARGUMENTS``: the torch reference, the
        CPU kernel, the Triton launcher), an attribute whose 0 means "none" as None."""
        values = {name: getattr(self, name) for name in KERNEL_ARGUMENTS}
        return {
            name: (values[name] or None) if name in _NONE_AT_ZERO else values[name]
            for name in values
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

#: The attributes an exported node carries: every one without a default, in field order (the
#: leading fields, as a dataclass's fields without defaults must be). Quantization adds the rest.
EXPORTED_ATTRIBUTES: tuple[str, ...] = tuple(
    name for name, _ in PLUGIN_ATTRIBUTES if name not in OPTIONAL_ATTRIBUTES
)

#: Attributes every PagedAttention node must carry (the TensorRT lint checks this list): the
#: TensorRT plugin lookup's two, then every attribute without a default.
REQUIRED_ATTRIBUTES: tuple[str, ...] = ("plugin_namespace", "plugin_version", *EXPORTED_ATTRIBUTES)

#: Attributes whose 0 means "none": a kernel takes None instead.
_NONE_AT_ZERO = frozenset(f.name for f in fields(PluginAttributes) if f.metadata["none_at_zero"])

#: Attributes a kernel is not given, with where it finds what they say.
_NOT_KERNEL_ARGUMENTS = {
    "block_size": "the caches' shape",
    "layer_idx": "the caches it is handed",
    "kv_cache_dtype": "the caches' dtype",
}

#: The kernels' keyword arguments, in field order.
KERNEL_ARGUMENTS: tuple[str, ...] = tuple(
    name for name, _ in PLUGIN_ATTRIBUTES if name not in _NOT_KERNEL_ARGUMENTS
)

KernelArguments = NamedTuple(
    "KernelArguments",
    [
        (name, kind | None if name in _NONE_AT_ZERO else kind)
        for name, kind in PLUGIN_ATTRIBUTES
        if name in KERNEL_ARGUMENTS
    ],
)
KernelArguments.__doc__ = """The attributes a kernel takes (``KERNEL_ARGUMENTS``), as the
implementation behind :func:`plugin_kernel` receives them: None where the attribute's 0 means
"none" (``sliding_window``, ``logit_softcap``)."""


def _node_parameters(tensor: object) -> list[Parameter]:
    inputs = [
        Parameter(name, Parameter.POSITIONAL_OR_KEYWORD, annotation=tensor) for name in INPUTS
    ]
    types = dict(PLUGIN_ATTRIBUTES)
    attributes = [
        Parameter(name, Parameter.POSITIONAL_OR_KEYWORD, annotation=types[name])
        for name in EXPORTED_ATTRIBUTES
    ]
    return inputs + attributes


def with_node_signature(function: Callable, tensor: object = Parameter.empty) -> Callable:
    """Give ``function`` (which takes ``*args, **kwargs``) the node's signature and return it:
    one parameter per input (annotated ``tensor``; unannotated by default), then one per
    exported attribute annotated with its type. ``torch.library.custom_op`` reads the op's
    schema from it, and the ONNX exporter tells a translation's inputs from its attributes by
    it (``__signature__`` and ``__annotations__`` both set). Unpack a call with
    :func:`bind_node_call`."""
    signature = inspect.Signature(_node_parameters(tensor), return_annotation=tensor)
    function.__signature__ = signature
    function.__annotations__ = {
        p.name: p.annotation for p in signature.parameters.values() if p.annotation is not p.empty
    }
    if tensor is not Parameter.empty:
        function.__annotations__["return"] = tensor
    return function


_NODE_SIGNATURE = inspect.Signature(_node_parameters(Parameter.empty))


def bind_node_call(
    args: Sequence[object], kwargs: dict[str, object]
) -> tuple[PluginInputs, PluginAttributes]:
    """A call through :func:`with_node_signature`: its inputs and its attributes (the optional ones
    defaulted). Raises TypeError for arguments the signature does not take."""
    values = _NODE_SIGNATURE.bind(*args, **kwargs).arguments
    inputs = PluginInputs(*(values[name] for name in INPUTS))
    return inputs, PluginAttributes(**{name: values[name] for name in EXPORTED_ATTRIBUTES})


def node_call(inputs: PluginInputs, attributes: PluginAttributes) -> tuple[object, ...]:
    """The positional arguments of a call through :func:`with_node_signature`."""
    return (*inputs, *attributes.exported_attributes().values())


_KERNEL_PARAMETERS = [
    *(Parameter(name, Parameter.POSITIONAL_ONLY) for name in INPUTS),
    *(
        Parameter(
            name,
            Parameter.KEYWORD_ONLY,
            default=OPTIONAL_ATTRIBUTES.get(name, Parameter.empty),
            annotation=KernelArguments.__annotations__[name],
        )
        for name in KERNEL_ARGUMENTS
    ),
]
_REQUIRED_KERNEL_ARGUMENTS = tuple(n for n in KERNEL_ARGUMENTS if n not in OPTIONAL_ATTRIBUTES)

_Result = TypeVar("_Result")


def plugin_kernel(implementation: Callable[..., _Result]) -> Callable[..., _Result]:
    """Decorate a kernel with the plugin's calling convention.

    ``implementation(inputs: PluginInputs, arguments: KernelArguments, *, **options)`` becomes
    ``kernel(q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables,
    slot_mapping, /, *, <KERNEL_ARGUMENTS>, <options>)``: the inputs positional in ``INPUTS``
    order, then the attributes as keywords (``PluginAttributes.kernel_arguments()``; the
    optional ones defaulted), then the implementation's own keyword-only options. The
    decorated function's ``inspect.signature`` is that signature.

    Raises:
        TypeError: at decoration, an option that is not keyword-only; at a call, a missing
            input or attribute (or an unknown keyword, from ``implementation``).
    """
    own = inspect.signature(implementation)
    options = list(own.parameters.values())[2:]
    if any(option.kind is not Parameter.KEYWORD_ONLY for option in options):
        raise TypeError(
            f"{implementation.__name__}: options after the first two must be keyword-only"
        )

    @functools.wraps(implementation)
    def kernel(*tensors: object, **keywords: object) -> _Result:
        missing = [name for name in _REQUIRED_KERNEL_ARGUMENTS if name not in keywords]
        if missing:
            raise TypeError(f"{implementation.__name__}() missing keyword argument(s): {missing}")
        arguments = KernelArguments(
            *(keywords.pop(name, OPTIONAL_ATTRIBUTES.get(name)) for name in KERNEL_ARGUMENTS)
        )
        return implementation(PluginInputs(*tensors), arguments, **keywords)

    kernel.__signature__ = own.replace(parameters=[*_KERNEL_PARAMETERS, *options])
    return kernel


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


def node_fpmath_mode(node: onnx.NodeProto) -> str:
    """A PagedAttention node's ``FPMATH_ATTRIBUTE`` ("strict" when absent). Raises LlmcError for
    a value not in ``FPMATH_MODES``."""
    mode = "strict"
    for attribute in node.attribute:
        if attribute.name == FPMATH_ATTRIBUTE:
            mode = helper.get_attribute_value(attribute).decode()
    if mode not in FPMATH_MODES:
        raise LlmcError(
            f"PagedAttention node {node.name!r}: {FPMATH_ATTRIBUTE} must be one of "
            f"{', '.join(FPMATH_MODES)}, got {mode!r}"
        )
    return mode


def is_plugin_node(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a PagedAttention node."""
    return node.domain == DOMAIN and node.op_type == OP_TYPE


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The PagedAttention nodes of ``model``'s main graph, in graph order."""
    return [n for n in model.graph.node if is_plugin_node(n)]
