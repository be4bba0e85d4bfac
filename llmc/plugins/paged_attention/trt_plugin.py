"""``llmc::PagedAttention`` as a TensorRT quickly-deployable plugin (QDP) on the Triton kernel.

NEVER RUN ON A GPU OR WITH TENSORRT: no machine of ours has either (DESIGN §6). This module is
written against TensorRT's documented ``tensorrt.plugin`` API. What runs here (tests without
TensorRT): :class:`PluginAttributes`, :func:`describe_outputs` (the descriptor's checks and
output shapes), trt_aot.py's ``compile_aot`` (Triton compiles the kernel to PTX for sm80..sm120
without a GPU; the tests do for sm80 and sm90) and the error
:func:`register_paged_attention_plugin` raises when ``tensorrt`` is missing. Never run: the
registration itself, the JIT implementation, TensorRT building an engine with this plugin and
launching the AOT kernel.

Sources (TensorRT 11 API; the same ``tensorrt.plugin`` module as 10.x):

- Python plugin guide, https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/
  pluginGuide.html, and the reference pages ``tensorrt.plugin/trt_plugin_register.html``,
  ``trt_plugin_impl.html`` and ``trt_plugin_aot_impl/index.html`` beside it: ``@register``
  (inputs ``TensorDesc`` first, then attributes of type int/float/str/bool/bytes, no lists),
  ``@impl`` (JIT, a Python callback per launch), ``@aot_impl`` (returns kernel name, PTX,
  ``KernelLaunchParams`` and ``SymIntExprs`` for the int32 scalars, which sit after the input
  pointers and before the output pointers; the engine then runs without Python).
- NVIDIA/TensorRT ``samples/python/quickly_deployable_plugins`` (``qdp_defs.py``, README): I/O
  aliasing for in-place plugins (``inp.aliased()``); an ONNX node maps to the plugin by
  ``op_type`` == plugin name plus a ``plugin_namespace`` attribute, and ``aot=1`` on the node
  asks for the AOT implementation.
- ``tensorrt/plugin/_lib.py`` and ``_validate.py`` (NVIDIA/TensorRT,
  ``python/packaging/bindings_wheel``): QDP plugins always have version "1"; attributes cannot
  have defaults; annotations are read as types (hence no ``from __future__ import annotations``
  in this module); the AOT path passes every attribute, in the descriptor's order.

What the TensorRT lowering must give the ONNX node (not verified against a parser here):
``op_type`` "PagedAttention", ``plugin_namespace`` "llmc", ``plugin_version`` "1", ``aot`` 1
(both implementations are registered; without ``aot`` or the network flag
``PREFER_AOT_PYTHON_PLUGINS`` TensorRT refuses to choose), every attribute of
:data:`PLUGIN_ATTRIBUTES` including the optional ones (:meth:`PluginAttributes.from_node` fills
their defaults), and three outputs: ``output``, then the key and value caches (aliased to inputs
3 and 4: the cache is updated in place; TensorRT 10.x gated plugin I/O aliasing behind
``PreviewFeature.ALIASED_PLUGIN_IO_10_03``).

AOT launch: grid ``(T // BLOCK_M + B, KVH)``, ``num_warps * 32`` threads. Triton 3.9 appends two
hidden pointer parameters (global and profile scratch) to the PTX entry; the kernel uses neither
(``compile_aot`` checks both sizes are 0), but whether TensorRT launches a PTX entry with
extra trailing parameters is unverified (its sample pins triton 3.2.0).
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
    """Register ``llmc::PagedAttention`` (version 1) with TensorRT's plugin registry: the
    descriptor, a JIT implementation (the Triton launcher on TensorRT's stream) and an AOT one
    (PTX compiled for the builder's GPU, so the engine runs without Python). Idempotent; call
    it before parsing an ONNX graph with PagedAttention nodes or deserializing a JIT engine.

    Raises:
        LlmcError: ``tensorrt`` (with ``tensorrt.plugin``, TensorRT >= 10.7) cannot be imported,
            or schema.PLUGIN_VERSION is not "1" (the only version QDP plugins have).
    """
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp
    except ImportError as error:
        raise LlmcError(
            "registering the PagedAttention TensorRT plugin needs TensorRT's Python package "
            "with tensorrt.plugin (TensorRT 11, e.g. pip install tensorrt-cu12 on a machine with "
            f"an NVIDIA GPU and driver); importing it failed: {error}"
        ) from error
    if PLUGIN_VERSION != "1":
        raise LlmcError(f"QDP plugins have version '1'; schema.PLUGIN_VERSION is {PLUGIN_VERSION}")
    try:
        if hasattr(getattr(trtp.op, PLUGIN_NAMESPACE), PLUGIN_NAME):
            return  # registered earlier in this process
    except AttributeError:
        pass  # no plugin in the namespace yet
    _register(trt, trtp)


def _register(trt, trtp) -> None:
    """Define and register the three plugin functions (their signatures are the QDP schema)."""
    dtype_names = {
        trt.float32: "float32",
        trt.float16: "float16",
        trt.bfloat16: "bfloat16",
        trt.fp8: "float8e4m3fn",
        trt.int8: "int8",
        trt.int32: "int32",
        trt.int64: "int64",
    }
    desc = trtp.TensorDesc

    @trtp.register(PLUGIN_ID)
    def paged_attention_desc(
        q: desc, k: desc, v: desc, key_cache: desc, value_cache: desc, seq_lens: desc,
        query_start_loc: desc, block_tables: desc, slot_mapping: desc,
        num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int,
        logit_softcap: float, block_size: int, layer_idx: int, kv_cache_dtype: str,
        k_scale: float, v_scale: float,
    ) -> tuple[desc, desc, desc]:  # fmt: skip
        attributes = PluginAttributes(
            num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            block_size, layer_idx, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
        attributes.check()
        tensors = (q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables,
                   slot_mapping)  # fmt: skip
        # Only dtypes and ranks here: TensorRT also calls this with placeholder shapes.
        describe_outputs([TensorSpec((None,) * t.ndim, dtype_names[t.dtype]) for t in tensors],
                         attributes)  # fmt: skip
        return q.like(), key_cache.aliased(), value_cache.aliased()

    @trtp.impl(PLUGIN_ID)
    def paged_attention_impl(
        q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables, slot_mapping,
        num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap, block_size,
        layer_idx, kv_cache_dtype, k_scale, v_scale, outputs, stream,
    ) -> None:  # fmt: skip
        import torch

        from llmc.plugins.paged_attention.triton_launch import paged_attention_triton

        def cuda(tensor):  # zero-copy torch views of TensorRT's buffers
            return torch.as_tensor(tensor, device="cuda")

        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            paged_attention_triton(
                cuda(q), cuda(k), cuda(v),
                cuda(outputs[1]), cuda(outputs[2]),  # the caches: aliased, writable
                cuda(seq_lens), cuda(query_start_loc), cuda(block_tables), cuda(slot_mapping),
                num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale,
                sliding_window=sliding_window or None, logit_softcap=logit_softcap or None,
                k_scale=k_scale, v_scale=v_scale, out=cuda(outputs[0]),
            )  # fmt: skip

    @trtp.aot_impl(PLUGIN_ID)
    def paged_attention_aot_impl(
        q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables, slot_mapping,
        num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap, block_size,
        layer_idx, kv_cache_dtype, k_scale, v_scale, outputs, tactic,
    ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:  # fmt: skip
        import triton

        from llmc.plugins.paged_attention.trt_aot import compile_aot

        attributes = PluginAttributes(
            num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            block_size, layer_idx, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
        target = triton.runtime.driver.active.get_current_target()  # the builder's GPU
        kernel = compile_aot(attributes, dtype_names[q.dtype], int(target.arch))
        num_tokens, num_seqs = q.shape_expr[0], seq_lens.shape_expr[0]
        launch = trtp.KernelLaunchParams()
        launch.grid_x = num_tokens // kernel.block_m + num_seqs
        launch.grid_y = num_kv_heads
        launch.block_x = kernel.num_warps * 32
        launch.shared_mem = kernel.shared_mem
        scalars = trtp.SymIntExprs.from_tuple(
            [trtp.SymInt32(num_seqs), trtp.SymInt32(block_tables.shape_expr[1])]
        )
        return kernel.name, kernel.ptx, launch, scalars
