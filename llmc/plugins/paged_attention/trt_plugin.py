"""``llmc::PagedAttention`` as a TensorRT quickly-deployable plugin (QDP) on the Triton kernel.

The plugin's contract with TensorRT (its attributes are ``llmc.engine.plugin.PluginAttributes``);
``trt_register.py`` registers it with TensorRT. NEVER RUN ON A GPU OR
WITH TENSORRT: no machine of ours has either (DESIGN §6). Tested here without TensorRT:
``PluginAttributes.from_fields`` (the attributes as the plugin receives them, NUL-terminated
strings included) and :func:`describe_outputs`; the TensorRT lint checks stages against these rules.

Rules read in the sources (NVIDIA/TensorRT v11.1 ``python/packaging/bindings_wheel/tensorrt/
plugin/``, its ``samples/python/quickly_deployable_plugins``, onnx/onnx-tensorrt's importer):

- ``@register`` takes input tensor descriptors, then int/float/str/bool/bytes attributes, which
  cannot have defaults; QDP plugins have version "1" (``_lib.py``, ``_validate.py``).
- onnx-tensorrt passes a node's attributes as plugin fields, only those the creator declares
  (``onnxOpImporters.cpp``, ``loadFields``; a missing one is skipped with a warning), so the
  lowered node carries every one of ``PLUGIN_ATTRIBUTES``. A string arrives with a NUL
  appended (``copyField(std::string)``, "as end of C style string") and QDP decodes
  ``f.data.tobytes()`` whole (``_lib.py``, ``_TemplatePluginCreator.create_plugin``):
  ``PluginAttributes.from_fields`` strips it.
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
extra trailing parameters is unverified (its sample pins an older Triton). Launched through the
CUDA driver with this grid and argument order and the two extra pointers null, the PTX matched
the reference on an H200 (``ci/gpu_aot_launch.py``).
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from llmc.engine.kv_cache import onnx_cache_type_name
from llmc.engine.plugin import INPUTS, PluginAttributes
from llmc.errors import LlmcError

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
    """The plugin's outputs for its 9 inputs (INPUTS order): ``output`` like q
    ([T, H*D], q's dtype), then the key and value caches as they came (aliased, same shape).

    Raises:
        LlmcError: wrong input count, rank or dtype, or a static dim that contradicts the
            attributes (H*D, KVH*D, block_size, KVH, D).
    """
    if len(inputs) != len(INPUTS):
        raise LlmcError(f"PagedAttention takes {len(INPUTS)} inputs, got {len(inputs)}")
    spec = dict(zip(INPUTS, inputs, strict=True))
    q_dtype = spec["q"].dtype
    if q_dtype not in _ACTIVATIONS:
        raise LlmcError(f"q must be one of {', '.join(_ACTIVATIONS)}, got {q_dtype}")
    cache_dtype = onnx_cache_type_name(attributes.kv_cache_dtype, q_dtype)
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
