"""Ahead-of-time compilation of the Triton paged-attention kernel to PTX, for TensorRT.

TensorRT's AOT plugin implementation (``@tensorrt.plugin.aot_impl``, see trt_plugin.py) hands
TensorRT a kernel name, its PTX and launch parameters; the engine then launches that kernel with
the input pointers, the int32 scalars and the output pointers, in that order. This module builds
the PTX with ``triton.compile`` for an explicit ``GPUTarget``, which needs no GPU: the tests
compile it here for sm80 and sm90 (never run on a GPU). Imports ``triton``.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc.errors import LlmcError
from llmc.plugins.paged_attention.trt_plugin import PluginAttributes

_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: Largest shared memory one thread block may use, bytes, per compute capability (CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability": 163 KB on 8.0, 99 KB on
#: 8.6/8.9/12.0, 227 KB on 9.0/10.0). Measured here: float32 inputs with head_dim 256 and
#: block_n 32 need 178 KB, so block_n is halved until the kernel fits.
MAX_SHARED_MEMORY = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


@dataclass(frozen=True)
class AotKernel:
    """A compiled kernel and what its launch needs.

    Attributes:
        name: the PTX entry's name.
        ptx: PTX text for ``arch``.
        arch: compute capability as an int (80 = sm80).
        num_warps: threads per program / 32 (the launch's block_x is ``num_warps * 32``).
        shared_mem: dynamic shared memory per program, bytes.
        block_m: new tokens per program (the grid is ``(T // block_m + B, KVH)``).
    """

    name: str
    ptx: str
    arch: int
    num_warps: int
    shared_mem: int
    block_m: int


def kernel_signature(activation_dtype: str, kv_cache_dtype: str) -> dict[str, str]:
    """Triton types of the kernel's runtime parameters, in launch order (input pointers, int32
    scalars, output pointers). An FP8 cache is bytes to the kernel (``*u8``), int8 ``*i8``.

    Raises:
        LlmcError: an activation dtype other than float32/float16/bfloat16, or an unknown
            ``kv_cache_dtype``.
    """
    from llmc.plugins.paged_attention import triton_kernel as kernel

    if activation_dtype not in _TRITON_TYPES:
        raise LlmcError(f"activations must be one of {', '.join(_TRITON_TYPES)}")
    act = "*" + _TRITON_TYPES[activation_dtype]
    caches = {"auto": act, "fp8": "*u8", "int8": "*i8"}
    if kv_cache_dtype not in caches:
        raise LlmcError(f"kv_cache_dtype must be one of {', '.join(caches)}")
    cache = caches[kv_cache_dtype]
    types = [act, act, act, cache, cache, "*i32", "*i32", "*i32", "*i64", "i32", "i32"]
    types += [act, cache, cache]
    names = (*kernel.POINTER_INPUTS, *kernel.SCALAR_INPUTS, *kernel.POINTER_OUTPUTS)
    return dict(zip(names, types, strict=True))


def compile_aot(
    attributes: PluginAttributes,
    activation_dtype: str,
    arch: int,
    *,
    block_m: int | None = None,
    block_n: int = 32,
) -> AotKernel:
    """Compile the kernel for one layer's constants and one GPU architecture (``arch``: 80, 86,
    89, 90, 100, 120), without a GPU. ``block_n`` is halved (down to 16) while the kernel needs
    more shared memory than ``arch`` offers.

    Raises:
        LlmcError: ``TRITON_INTERPRET=1`` is set (the kernel is then an interpreter function),
            the attributes are invalid, ``arch`` is unknown, the kernel does not fit the shared
            memory even at ``block_n`` 16, or it needs Triton's scratch memory (TensorRT's AOT
            launch does not pass those hidden pointers).
    """
    if arch not in MAX_SHARED_MEMORY:
        raise LlmcError(f"unknown GPU architecture sm{arch}; known: {sorted(MAX_SHARED_MEMORY)}")
    while True:
        kernel = _compile(attributes, activation_dtype, arch, block_m, block_n)
        if kernel.shared_mem <= MAX_SHARED_MEMORY[arch]:
            return kernel
        if block_n <= 16:
            raise LlmcError(
                f"the paged-attention kernel needs {kernel.shared_mem} bytes of shared memory, "
                f"sm{arch} has {MAX_SHARED_MEMORY[arch]}: use float16/bfloat16 activations"
            )
        block_n //= 2


def _compile(
    attributes: PluginAttributes,
    activation_dtype: str,
    arch: int,
    block_m: int | None,
    block_n: int,
) -> AotKernel:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llmc.plugins.paged_attention import triton_kernel, triton_launch

    attributes.check()
    if not isinstance(triton_kernel.paged_attention_kernel, triton.runtime.JITFunction):
        raise LlmcError("TRITON_INTERPRET=1 is set: unset it to compile the kernel for a GPU")
    config = triton_launch.kernel_config(
        attributes.num_heads,
        attributes.num_kv_heads,
        attributes.head_dim,
        block_m=block_m,
        block_n=block_n,
    )
    constants = triton_launch.kernel_constants(
        config,
        num_heads=attributes.num_heads,
        num_kv_heads=attributes.num_kv_heads,
        head_dim=attributes.head_dim,
        block_size=attributes.block_size,
        scale=attributes.scale,
        sliding_window=attributes.sliding_window,
        logit_softcap=attributes.logit_softcap,
        cache_quant={"auto": "none"}.get(attributes.kv_cache_dtype, attributes.kv_cache_dtype),
        k_scale=attributes.k_scale,
        v_scale=attributes.v_scale,
        float32_inputs=activation_dtype == "float32",
    )
    signature = kernel_signature(activation_dtype, attributes.kv_cache_dtype)
    signature.update(dict.fromkeys(constants, "constexpr"))
    source = ASTSource(
        fn=triton_kernel.paged_attention_kernel, signature=signature, constexprs=constants
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    metadata = compiled.metadata
    if metadata.global_scratch_size or metadata.profile_scratch_size:
        raise LlmcError(
            f"the paged-attention kernel for sm{arch} needs Triton scratch memory, which "
            "TensorRT's AOT launch does not provide; report this with the layer's attributes"
        )
    return AotKernel(
        name=metadata.name,
        ptx=compiled.asm["ptx"],
        arch=arch,
        num_warps=metadata.num_warps,
        shared_mem=metadata.shared,
        block_m=config.block_m,
    )
