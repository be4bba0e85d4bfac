"""``llmc::PagedAttention`` as a TensorRT quickly-deployable plugin (QDP) on the Triton kernel.

The plugin's contract; ``trt_register.py`` registers it with TensorRT. NEVER RUN ON A GPU OR
WITH TENSORRT: no machine of ours has either (DESIGN §6). Tested here without TensorRT:
:class:`PluginAttributes` (also as the plugin receives them, NUL-terminated strings included)
and :func:`describe_outputs`; the TensorRT lint checks stages against these rules.

Rules read in the sources (NVIDIA/TensorRT v11.1 ``python/packaging/bindings_wheel/tensorrt/
plugin/``, its ``samples/python/quickly_deployable_plugins``, onnx/onnx-tensorrt's importer):

- ``@register`` takes input tensor descriptors, then int/float/str/bool/bytes attributes, which
  cannot have defaults; QDP plugins have version "1" (``_lib.py``, ``_validate.py``).
- onnx-tensorrt passes a node's attributes as plugin fields, only those the creator declares
  (``onnxOpImporters.cpp``, ``loadFields``; a missing one is skipped with a warning), so the
  lowered node carries every one of :data:`PLUGIN_ATTRIBUTES`. A string arrives with a NUL
  appended (``copyField(std::string)``, "as end of C style string") and QDP decodes
  ``f.data.tobytes()`` whole (``_lib.py``, ``_TemplatePluginCreator.create_plugin``):
  :meth:`PluginAttributes.from_fields` strips it.
- The node has as many outputs as the plugin declares (:data:`OUTPUTS`; ``ModelImporter.cpp``,
  ``parseNode``: "Node has more output tensors than TRT expected"); outputs 1 and 2 alias the
  caches (``TensorDesc.aliased()``), are graph outputs named :func:`aliased_output_name` and are
  bound to the caches' memory, as the sample's ``run_inplace_add`` binds ``y`` to ``x``. Aliasing
  takes effect only with ``PreviewFeature.ALIASED_PLUGIN_IO_10_03`` (``NvInferRuntime.h``,
  ``IPluginV3OneBuildV2::getAliasedInput``: "only be called and have an effect when
  PreviewFeature::kALIASED_PLUGIN_IO_10_03 is turned on").
- Both a JIT and an AOT implementation are registered, so each node says which: ``aot=1``
  (:data:`AOT_ATTRIBUTE`; ``importerUtils.cpp``, ``createPlugin``: a node-level ``aot``
  overrides the network flags; with neither, ``create_plugin`` raises "has both AOT and JIT
  implementations").
- ``tensorrt.plugin.Tensor.__cuda_array_interface__`` raises for BF16, FP8 and INT4
  (``_tensor.py``): the JIT path views buffers through
  ``trt_register.cuda_array_interface``.

AOT launch: grid ``(T // BLOCK_M + B, KVH)``, ``num_warps * 32`` threads. Triton 3.9 appends two
hidden pointer parameters (global and profile scratch) to the PTX entry; the kernel uses neither
(``compile_aot`` checks both sizes are 0), but whether TensorRT launches a PTX entry with
extra trailing parameters is unverified (its sample pins an older Triton).
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from llmc.errors import LlmcError
from llmc.plugins import schema

PLUGIN_NAMESPACE = schema.DOMAIN
PLUGIN_NAME = schema.OP_TYPE
PLUGIN_VERSION = schema.PLUGIN_VERSION
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"

#: The plugin's attributes in the descriptor's order (every one must be on the ONNX node).
PLUGIN_ATTRIBUTES: tuple[tuple[str, type], ...] = (
    ("num_heads", int),
    ("num_kv_heads", int),
    ("head_dim", int),
    ("scale", float),
    ("sliding_window", int),
    ("logit_softcap", float),
    ("block_size", int),
    ("layer_idx", int),
    ("kv_cache_dtype", str),
    ("k_scale", float),
    ("v_scale", float),
)

#: Plugin outputs; outputs 1 and 2 alias inputs 3 and 4 (the caches, written in place).
OUTPUTS = ("output", "key_cache", "value_cache")
ALIASED_INPUTS = {1: 3, 2: 4}

#: The node attribute that picks the AOT implementation (onnx-tensorrt ``createPlugin``).
AOT_ATTRIBUTE = "aot"

#: Suffix of the graph output that aliases a cache input (``key_cache.0`` ->
#: ``key_cache.0.updated``); the runner binds it to the cache's memory by this name.
ALIASED_OUTPUT_SUFFIX = ".updated"


def aliased_output_name(cache_input: str) -> str:
    """Name of the graph output aliased to the cache graph input ``cache_input``."""
    return cache_input + ALIASED_OUTPUT_SUFFIX


_ACTIVATIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_CACHE_DTYPES = {"fp8": "float8e4m3fn", "int8": "int8"}  # "auto": the activations' dtype


@dataclass(frozen=True)
class PluginAttributes:
    """One PagedAttention node's attributes as the plugin receives them (schema.py's meaning)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int
    logit_softcap: float
    block_size: int
    layer_idx: int
    kv_cache_dtype: str
    k_scale: float
    v_scale: float

    @classmethod
    def from_node(cls, node: onnx.NodeProto) -> "PluginAttributes":
        """Read a node, the optional attributes defaulted (schema.OPTIONAL_ATTRIBUTES).

        Raises:
            LlmcError: a required attribute is missing, or a value is invalid.
        """
        values = dict(schema.OPTIONAL_ATTRIBUTES)
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            values[attribute.name] = value.decode() if isinstance(value, bytes) else value
        missing = [name for name, _ in PLUGIN_ATTRIBUTES if name not in values]
        if missing:
            raise LlmcError(
                f"PagedAttention node {node.name!r} lacks attribute(s) {', '.join(missing)}; "
                "re-export the model with this llmc version"
            )
        attributes = cls(**{name: kind(values[name]) for name, kind in PLUGIN_ATTRIBUTES})
        attributes.check()
        return attributes

    @classmethod
    def from_fields(cls, *values) -> "PluginAttributes":
        """The attributes as TensorRT hands them to the plugin, in :data:`PLUGIN_ATTRIBUTES`
        order; string fields may end in NULs (onnx-tensorrt ``copyField(std::string)`` appends
        one and QDP keeps it), which are stripped. Raises LlmcError like :meth:`check`."""
        if len(values) != len(PLUGIN_ATTRIBUTES):
            raise LlmcError(f"PagedAttention takes {len(PLUGIN_ATTRIBUTES)} attributes")
        fields = {
            name: kind(value.rstrip("\x00") if isinstance(value, str) else value)
            for (name, kind), value in zip(PLUGIN_ATTRIBUTES, values, strict=True)
        }
        attributes = cls(**fields)
        attributes.check()
        return attributes

    def check(self) -> None:
        """Raise LlmcError unless the head counts and the cache dtype are ones the kernel runs."""
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise LlmcError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.kv_cache_dtype not in schema.KV_CACHE_DTYPES:
            raise LlmcError(
                f"kv_cache_dtype must be one of {', '.join(schema.KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )

    def node_attributes(self) -> dict[str, object]:
        """Every plugin attribute in :data:`PLUGIN_ATTRIBUTES` order, for the lowered node."""
        return {name: getattr(self, name) for name, _ in PLUGIN_ATTRIBUTES}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the builder sees it: dims are ints, or names/None when dynamic; dtype is an
    ONNX-style name ("float16", "bfloat16", "float32", "float8e4m3fn", "int8", "int32", "int64").
    """

    shape: tuple[int | str | None, ...]
    dtype: str


def describe_outputs(
    inputs: Sequence[TensorSpec], attributes: PluginAttributes
) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    """The plugin's outputs for its 9 inputs (schema.INPUTS order): ``output`` like q
    ([T, H*D], q's dtype), then the key and value caches as they came (aliased, same shape).

    Raises:
        LlmcError: wrong input count, rank or dtype, or a static dim that contradicts the
            attributes (H*D, KVH*D, block_size, KVH, D).
    """
    if len(inputs) != len(schema.INPUTS):
        raise LlmcError(f"PagedAttention takes {len(schema.INPUTS)} inputs, got {len(inputs)}")
    spec = dict(zip(schema.INPUTS, inputs, strict=True))
    q_dtype = spec["q"].dtype
    if q_dtype not in _ACTIVATIONS:
        raise LlmcError(f"q must be one of {', '.join(_ACTIVATIONS)}, got {q_dtype}")
    cache_dtype = _CACHE_DTYPES.get(attributes.kv_cache_dtype, q_dtype)
    a = attributes
    expected = {  # name: (dtype, dims; None = any)
        "q": (q_dtype, (None, a.num_heads * a.head_dim)),
        "k": (q_dtype, (None, a.num_kv_heads * a.head_dim)),
        "v": (q_dtype, (None, a.num_kv_heads * a.head_dim)),
        "key_cache": (cache_dtype, (None, a.block_size, a.num_kv_heads, a.head_dim)),
        "value_cache": (cache_dtype, (None, a.block_size, a.num_kv_heads, a.head_dim)),
        "seq_lens": ("int32", (None,)),
        "query_start_loc": ("int32", (None,)),
        "block_tables": ("int32", (None, None)),
        "slot_mapping": ("int64", (None,)),
    }
    for name, (dtype, dims) in expected.items():
        tensor = spec[name]
        if tensor.dtype != dtype:
            raise LlmcError(
                f"PagedAttention input {name} must be {dtype} "
                f"(kv_cache_dtype={a.kv_cache_dtype!r}), got {tensor.dtype}"
            )
        if len(tensor.shape) != len(dims):
            raise LlmcError(f"PagedAttention input {name} must have rank {len(dims)}")
        for axis, (got, want) in enumerate(zip(tensor.shape, dims, strict=True)):
            if want is not None and isinstance(got, int) and got != want:
                raise LlmcError(
                    f"PagedAttention input {name} has dim {axis} = {got}, the attributes say {want}"
                )
    return (
        TensorSpec(spec["q"].shape, q_dtype),
        dataclasses.replace(spec["key_cache"]),
        dataclasses.replace(spec["value_cache"]),
    )


def register_paged_attention_plugin() -> None:
    """Register the plugin with TensorRT (:func:`llmc.plugins.paged_attention.trt_register.
    register`, which says what it raises); kept here for callers of this module."""
    from llmc.plugins.paged_attention.trt_register import register

    register()
