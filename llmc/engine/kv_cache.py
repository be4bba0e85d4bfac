"""KV-cache element types and geometry: the one place that says what each cache dtype is.

``kv_cache_dtype`` has two spellings. On the plugin node (and ``--kv-cache-dtype``) it is one of
``KV_CACHE_DTYPES``: "auto" keeps the cache in the compute dtype, "fp8" is FP8 E4M3FN (OCP 8-bit
floating point, max 448), "int8" symmetric int8 (zero point 0, [-127, 127]). In an engine
manifest it is what the engine stores: the compute dtype's name ("float32"; TensorRT plans also
"float16", "bfloat16"), "fp8" or "int8".
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

from llmc.errors import EngineCorruptError

#: Values of the plugin's ``kv_cache_dtype`` attribute.
KV_CACHE_DTYPES = ("auto", "fp8", "int8")

#: numpy dtype of the CPU kernel's cache for each ``kv_cache_dtype`` attribute value, in the
#: order of the C kernel's ``PA_CACHE_*`` codes ("auto" is float32, the CPU's compute dtype).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "auto": np.dtype(np.float32),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
    "int8": np.dtype(np.int8),
}

#: ONNX element type of a quantized cache ("auto": the compute dtype's).
QUANTIZED_ONNX_TYPES = {"fp8": onnx.TensorProto.FLOAT8E4M3FN, "int8": onnx.TensorProto.INT8}


def kv_cache_numpy_dtype(kv_cache_dtype: str) -> np.dtype:
    """The numpy dtype of a ``kv_cache_dtype`` attribute value; ValueError for an unknown one."""
    if kv_cache_dtype not in NUMPY_DTYPES:
        known = ", ".join(NUMPY_DTYPES)
        raise ValueError(f"kv_cache_dtype must be one of {known}, got {kv_cache_dtype!r}")
    return NUMPY_DTYPES[kv_cache_dtype]


def onnx_cache_type(kv_cache_dtype: str, compute_type: int) -> int:
    """The ONNX element type of a cache of ``kv_cache_dtype`` beside activations of
    ``compute_type`` (an ``onnx.TensorProto`` type)."""
    return QUANTIZED_ONNX_TYPES.get(kv_cache_dtype, compute_type)


def onnx_cache_type_name(kv_cache_dtype: str, activation: str) -> str:
    """The cache's ONNX-style type name ("float8e4m3fn", "int8") for ``kv_cache_dtype``, or
    ``activation`` (the activations' name) for "auto"."""
    if kv_cache_dtype not in QUANTIZED_ONNX_TYPES:
        return activation
    return onnx.TensorProto.DataType.Name(QUANTIZED_ONNX_TYPES[kv_cache_dtype]).lower()


def kv_cache_dtype_of(manifest) -> np.dtype:
    """The element type a runner allocates an engine's KV cache in, from its manifest's
    ``kv_cache_dtype`` (an ``EngineManifest`` or any object with that field): a compute dtype
    or a quantized one ("fp8": float8_e4m3fn, "int8"). Pool sizing and ``TrtRunner`` read the
    cache's element size here; ``OrtRunner`` allocates by the plan's attribute
    (``kv_cache_numpy_dtype``).

    Raises:
        EngineCorruptError: for a name llmc does not know.
    """
    name = manifest.kv_cache_dtype
    if name in NUMPY_DTYPES:
        return NUMPY_DTYPES[name]
    try:
        return np.dtype(name)  # ml_dtypes (imported above) registers bfloat16 with numpy
    except TypeError:
        raise EngineCorruptError(
            f"the manifest's kv_cache_dtype {name!r} is not one llmc knows; rebuild the engine"
        ) from None


@dataclass(frozen=True)
class CacheSpec:
    """Per-layer KV cache geometry: [num_blocks, block_size, num_kv_heads, head_dim] of
    ``dtype`` (a ``torch.dtype``: the model's)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: object


def cache_spec(model) -> CacheSpec:
    """Read the KV geometry from a transformers model (its config and its weights' dtype)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return CacheSpec(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        dtype=next(model.parameters()).dtype,
    )
