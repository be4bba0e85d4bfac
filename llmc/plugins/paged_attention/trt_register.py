"""Registration of ``llmc::PagedAttention`` with TensorRT's plugin registry (``tensorrt.plugin``).

NEVER RUN: no machine of ours has TensorRT or a GPU (DESIGN §6). The contract the three
functions implement (attributes, outputs, aliasing, the rules read in TensorRT's sources) is in
``trt_plugin.py``; this module only wires it to ``@trtp.register``, ``@trtp.impl`` (JIT: the
Triton launcher on TensorRT's stream) and ``@trtp.aot_impl`` (PTX from ``trt_aot.py``). Tested
here: :func:`cuda_array_interface` and the error :func:`register` raises without TensorRT.
"""

from collections.abc import Sequence

from llmc.engine.plugin import DOMAIN, OP_TYPE, PLUGIN_ID, PLUGIN_VERSION, PluginAttributes
from llmc.errors import LlmcError
from llmc.plugins.paged_attention.trt_plugin import TensorSpec, describe_outputs


def register() -> None:
    """Register ``llmc::PagedAttention`` (version 1) with TensorRT's plugin registry: the
    descriptor, a JIT implementation (the Triton launcher on TensorRT's stream) and an AOT one
    (PTX compiled for the builder's GPU, so the engine runs without Python). Idempotent; call
    it before parsing an ONNX graph with PagedAttention nodes or deserializing a JIT engine.

    Raises:
        LlmcError: ``tensorrt`` (with ``tensorrt.plugin``, TensorRT >= 10.7) cannot be imported,
            or PLUGIN_VERSION is not "1" (the only version QDP plugins have).
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
        raise LlmcError(f"QDP plugins have version '1'; PLUGIN_VERSION is {PLUGIN_VERSION}")
    try:
        if hasattr(getattr(trtp.op, DOMAIN), OP_TYPE):
            return  # registered earlier in this process
    except AttributeError:
        pass  # no plugin in the namespace yet
    _register(trt, trtp)


#: Same-width integer ``typestr`` per element size (``__cuda_array_interface__``, version 3).
_RAW_TYPESTR = {1: "|i1", 2: "<i2", 4: "<i4", 8: "<i8"}


def cuda_array_interface(
    data_ptr: int, shape: Sequence[int], strides: Sequence[int], itemsize: int
) -> dict:
    """A version-3 ``__cuda_array_interface__`` describing a buffer as integers of ``itemsize``
    bytes (``strides`` in elements, like ``tensorrt.plugin.Tensor.strides``); torch views the
    result as the real dtype (bfloat16, float8_e4m3fn), which the interface cannot name."""
    return {
        "shape": tuple(int(d) for d in shape),
        "typestr": _RAW_TYPESTR[itemsize],
        "data": (int(data_ptr), False),
        "strides": tuple(int(s) * itemsize for s in strides),
        "version": 3,
        "stream": None,  # the caller runs on TensorRT's stream already
    }


def _register(trt, trtp) -> None:
    """Define and register the three plugin functions (their signatures are the QDP schema)."""
    dtypes = _dtypes(trt)
    _register_descriptor(trtp, dtypes)
    _register_jit(trtp, dtypes)
    _register_aot(trtp, dtypes)


def _dtypes(trt) -> dict:
    """TensorRT dtype -> (descriptor dtype name, torch dtype)."""
    import torch

    return {
        trt.float32: ("float32", torch.float32),
        trt.float16: ("float16", torch.float16),
        trt.bfloat16: ("bfloat16", torch.bfloat16),
        trt.fp8: ("float8e4m3fn", torch.float8_e4m3fn),
        trt.int8: ("int8", torch.int8),
        trt.int32: ("int32", torch.int32),
        trt.int64: ("int64", torch.int64),
    }


class _Buffer:  # holds a __cuda_array_interface__ for torch.as_tensor
    def __init__(self, interface: dict):
        self.__cuda_array_interface__ = interface


def _cuda(tensor, dtypes: dict):
    """A zero-copy torch view of TensorRT's buffer ``tensor`` (a ``tensorrt.plugin.Tensor``)."""
    import torch

    dtype = dtypes[tensor.dtype][1]
    itemsize = torch.empty((), dtype=dtype).element_size()
    interface = cuda_array_interface(tensor.data_ptr, tensor.shape, tensor.strides, itemsize)
    return torch.as_tensor(_Buffer(interface), device="cuda").view(dtype)


def _register_descriptor(trtp, dtypes: dict) -> None:
    """Register the descriptor: the outputs' dtypes and ranks, the caches aliased."""
    desc = trtp.TensorDesc

    @trtp.register(PLUGIN_ID)
    def paged_attention_desc(
        q: desc, k: desc, v: desc, key_cache: desc, value_cache: desc, seq_lens: desc,
        query_start_loc: desc, block_tables: desc, slot_mapping: desc,
        num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int,
        logit_softcap: float, block_size: int, layer_idx: int, kv_cache_dtype: str,
        k_scale: float, v_scale: float,
    ) -> tuple[desc, desc, desc]:  # fmt: skip
        attributes = PluginAttributes.from_fields(
            num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            block_size, layer_idx, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
        tensors = (q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables,
                   slot_mapping)  # fmt: skip
        # Only dtypes and ranks here: TensorRT also calls this with placeholder shapes.
        describe_outputs([TensorSpec((None,) * t.ndim, dtypes[t.dtype][0]) for t in tensors],
                         attributes)  # fmt: skip
        return q.like(), key_cache.aliased(), value_cache.aliased()


def _register_jit(trtp, dtypes: dict) -> None:
    """Register the JIT implementation: the Triton launcher on TensorRT's stream."""
    import torch

    def cuda(tensor) -> torch.Tensor:
        return _cuda(tensor, dtypes)

    @trtp.impl(PLUGIN_ID)
    def paged_attention_impl(
        q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables, slot_mapping,
        num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap, block_size,
        layer_idx, kv_cache_dtype, k_scale, v_scale, outputs, stream,
    ) -> None:  # fmt: skip
        from llmc.plugins.paged_attention.triton_launch import paged_attention_triton

        a = PluginAttributes.from_fields(
            num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            block_size, layer_idx, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            paged_attention_triton(
                cuda(q), cuda(k), cuda(v),
                cuda(outputs[1]), cuda(outputs[2]),  # the caches: aliased, writable
                cuda(seq_lens), cuda(query_start_loc), cuda(block_tables), cuda(slot_mapping),
                **a.kernel_arguments(), out=cuda(outputs[0]),
            )  # fmt: skip


def _register_aot(trtp, dtypes: dict) -> None:
    """Register the AOT implementation: PTX from ``trt_aot.py`` for the builder's GPU."""

    @trtp.aot_impl(PLUGIN_ID)
    def paged_attention_aot_impl(
        q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables, slot_mapping,
        num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap, block_size,
        layer_idx, kv_cache_dtype, k_scale, v_scale, outputs, tactic,
    ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:  # fmt: skip
        import triton

        from llmc.plugins.paged_attention.trt_aot import compile_aot

        attributes = PluginAttributes.from_fields(
            num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            block_size, layer_idx, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
        target = triton.runtime.driver.active.get_current_target()  # the builder's GPU
        kernel = compile_aot(attributes, dtypes[q.dtype][0], int(target.arch))
        num_tokens, num_seqs = q.shape_expr[0], seq_lens.shape_expr[0]
        launch = trtp.KernelLaunchParams()
        launch.grid_x, launch.grid_y = kernel.grid(num_tokens, num_seqs, num_kv_heads)
        launch.block_x = kernel.num_warps * 32
        launch.shared_mem = kernel.shared_mem
        scalars = trtp.SymIntExprs.from_tuple(
            [trtp.SymInt32(num_seqs), trtp.SymInt32(block_tables.shape_expr[1])]
        )
        return kernel.name, kernel.ptx, launch, scalars
