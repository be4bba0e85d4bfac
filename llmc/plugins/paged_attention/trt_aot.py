"""Ahead-of-time compilation of the Triton paged-attention kernel to PTX, for TensorRT.

TensorRT's AOT plugin implementation (``@tensorrt.plugin.aot_impl``, see trt_register.py) hands
TensorRT a kernel name, its PTX and launch parameters; the engine then launches that kernel with
the input pointers, the int32 scalars and the output pointers, in that order. This module builds
the PTX with ``triton.compile`` for an explicit ``GPUTarget``, which needs no GPU: the tests
compile it here for sm80 and sm90 (never run on a GPU). Imports ``triton``.

Two limits the PTX must meet, both checked again by the TensorRT lint on the portable stage:

- PTX ISA version. Triton writes the ISA of its bundled ``ptxas`` into the PTX (triton 3.9,
  ``backends/nvidia/compiler.py``, ``make_ptx`` rewrites ``.version`` to ``ptx_get_version``
  of ``ptxas --version``: 9.4 for sm90+ with its CUDA 13.4 ``ptxas-blackwell``), but TensorRT
  compiles the PTX with the CUDA it was built for (TensorRT 11.1: CUDA 13.3, PTX ISA <= 9.3;
  its sample pins triton 3.5). So the ISA is pinned (``ptx_version``, a ``CUDAOptions`` field)
  to :data:`PTX_ISA`: the oldest that has every target llmc builds (sm_120 appeared in PTX ISA
  8.7, CUDA 12.8; PTX ISA release notes) and at most the ISA of every CUDA release TensorRT 11
  ships for (:data:`TENSORRT_CUDA_RELEASES`).
- Dynamic shared memory. A launch with more than 48 KB of dynamic shared memory fails unless the
  kernel opted in (CUDA C++ Programming Guide, "Shared Memory": above 48 KB, "require an
  explicit opt-in" with ``cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)``).
  Triton's own launcher opts in (``backends/nvidia/driver.c``, ``loadBinary``: ``if (shared >
  49152 && shared_optin > 49152) cuFuncSetAttribute(...MAX_DYNAMIC_SHARED_SIZE_BYTES...)``);
  TensorRT's launch of AOT PTX is not known to, so AOT kernels are tiled to fit
  :data:`AOT_SHARED_MEMORY_LIMIT`.

The kernel is compiled with every pointer parameter 16-byte aligned (``tt.divisibility`` 16, as
Triton's JIT specializes an aligned torch tensor): without it Triton emits scalar loads only, and
the kernel ran 1.1-6.5x slower on an H200 (``benchmarks/bench_trt_aot.py``; RESULTS). TensorRT
is assumed to hand the plugin 16-byte aligned buffers; no TensorRT document found states it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmc.engine.plugin import PluginAttributes
from llmc.errors import LlmcError

_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: Largest shared memory one thread block may use with the opt-in, bytes, per compute capability
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability", "Maximum
#: amount of shared memory per thread block": 163 KB on 8.0, 99 KB on 8.6/8.9/12.0, 227 KB on
#: 9.0/10.0).
MAX_SHARED_MEMORY = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}

#: Dynamic shared memory a kernel may use without the opt-in (48 KB, see the module doc).
AOT_SHARED_MEMORY_LIMIT = 48 * 1024

#: The PTX ISA version the AOT kernel is written in (see the module doc).
PTX_ISA = (8, 7)

#: Oldest PTX ISA each target needs (PTX ISA, "Target ISA Notes": sm_80 7.0, sm_86 7.1, sm_89
#: 7.8, sm_90a 8.0, sm_100a 8.6, sm_120a 8.7; Triton emits the "a" targets for 9.0 and up).
MIN_PTX_ISA = {80: (7, 0), 86: (7, 1), 89: (7, 8), 90: (8, 0), 100: (8, 6), 120: (8, 7)}

#: CUDA releases the TensorRT 11 wheels are built for: tensorrt-cu12 (12.9, the last 12.x) and
#: tensorrt-cu13 (13.3 for TensorRT 11.1). The PTX must be an ISA every one of them reads.
TENSORRT_CUDA_RELEASES = ((12, 9), (13, 3))


def aot_block_n(attributes: PluginAttributes, activation_dtype: str, arch: int) -> int | None:
    """The key tile (``block_n``) :func:`compile_aot` starts from: the largest of 32 and 16 whose
    dynamic shared memory (``triton_tiles.shared_memory_bytes``, the kernel's tile formula)
    fits :func:`shared_memory_limit`; None when neither does. Pure: no triton, no GPU."""
    from llmc.plugins.paged_attention import triton_tiles

    limit = shared_memory_limit(arch)
    for block_n in (32, 16):
        config = triton_tiles.kernel_config(
            attributes.num_heads, attributes.num_kv_heads, attributes.head_dim, block_n=block_n
        )
        if triton_tiles.shared_memory_bytes(attributes.head_dim, activation_dtype, config) <= limit:
            return block_n
    return None


def ptx_isa_of_cuda(cuda: tuple[int, int]) -> tuple[int, int]:
    """The newest PTX ISA a CUDA release reads (PTX ISA release notes; the same table as
    triton 3.9's ``ptx_get_version``): 12.0-12.5 -> 8.0-8.5, 12.6-12.9 -> 8.5-8.8, 13.x ->
    9.x."""
    major, minor = cuda
    if major == 12:
        return (8, minor if minor < 6 else minor - 1)
    if major >= 13:
        return (9 + (major - 13), minor)
    raise LlmcError(f"CUDA {major}.{minor} is older than any TensorRT 11 build")


def ptx_isa_ceiling() -> tuple[int, int]:
    """The newest PTX ISA every CUDA release of :data:`TENSORRT_CUDA_RELEASES` reads."""
    return min(ptx_isa_of_cuda(c) for c in TENSORRT_CUDA_RELEASES)


def ptx_isa_of(ptx: str) -> tuple[int, int]:
    """The ``.version`` of a PTX module; LlmcError when it has none."""
    m = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.MULTILINE)
    if m is None:
        raise LlmcError("the PTX has no .version directive")
    return int(m.group(1)), int(m.group(2))


def shared_memory_limit(arch: int, opted_in: bool = False) -> int:
    """Dynamic shared memory a kernel for ``arch`` may use: 48 KB without the opt-in (AOT),
    the architecture's per-block maximum with it (Triton's own launcher)."""
    if arch not in MAX_SHARED_MEMORY:
        raise LlmcError(f"unknown GPU architecture sm{arch}; known: {sorted(MAX_SHARED_MEMORY)}")
    most = MAX_SHARED_MEMORY[arch]
    return most if opted_in else min(AOT_SHARED_MEMORY_LIMIT, most)


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

    def grid(self, num_tokens, num_seqs, num_kv_heads):
        """The launch grid ``(T // block_m + B, KVH)``: one program per ``block_m`` new tokens of
        a sequence (a sequence's last tile may be partial, hence ``+ B``) per KV head. Works on
        ints and on TensorRT's symbolic shape expressions alike."""
        return num_tokens // self.block_m + num_seqs, num_kv_heads


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
    block_n: int | None = None,
) -> AotKernel:
    """Compile the kernel for one layer's constants and one GPU architecture (``arch``: 80, 86,
    89, 90, 100, 120), without a GPU, as PTX ISA :data:`PTX_ISA`. ``block_n`` defaults to
    :func:`aot_block_n` (what the TensorRT lint checks) and is halved (down to 16) while the
    compiled kernel needs more dynamic shared memory than an AOT launch may use
    (:func:`shared_memory_limit`: 48 KB).

    Raises:
        LlmcError: ``TRITON_INTERPRET=1`` is set (the kernel is then an interpreter function),
            the attributes are invalid, ``arch`` is unknown, the kernel does not fit the shared
            memory even at ``block_n`` 16, it needs Triton's scratch memory (TensorRT's AOT
            launch does not pass those hidden pointers), or its PTX is not :data:`PTX_ISA`.
    """
    limit = shared_memory_limit(arch)
    block_n = block_n or aot_block_n(attributes, activation_dtype, arch) or 16
    while True:
        kernel = compile_kernel(attributes, activation_dtype, arch, block_m, block_n)
        if kernel.shared_mem <= limit:
            return kernel
        if block_n <= 16:
            raise LlmcError(
                f"the paged-attention kernel needs {kernel.shared_mem} bytes of shared memory, "
                f"an AOT launch on sm{arch} may use {limit}: use float16/bfloat16 activations"
            )
        block_n //= 2


def compile_kernel(
    attributes: PluginAttributes,
    activation_dtype: str,
    arch: int,
    block_m: int | None,
    block_n: int,
    num_stages: int = 1,
    aligned: bool = True,
) -> AotKernel:
    """The main kernel (no split decode) for one layer and ``sm{arch}`` with these tiles, as PTX
    ISA :data:`PTX_ISA`; no GPU needed. ``aligned`` compiles with every pointer parameter known
    to be 16-byte aligned (``tt.divisibility`` 16: what Triton's JIT assumes of an aligned torch
    tensor, and what lets it vectorize the K/V tile loads). :func:`compile_aot` chooses the
    tiles; ``benchmarks/bench_trt_aot.py`` compares others.

    Raises:
        LlmcError: ``TRITON_INTERPRET=1`` is set, the attributes are invalid, the kernel needs
            Triton's scratch memory, or its PTX is not :data:`PTX_ISA`.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llmc.plugins.paged_attention import triton_kernel, triton_tiles

    attributes.check()
    if not isinstance(triton_kernel.paged_attention_kernel, triton.runtime.JITFunction):
        raise LlmcError("TRITON_INTERPRET=1 is set: unset it to compile the kernel for a GPU")
    config = triton_tiles.kernel_config(
        attributes.num_heads,
        attributes.num_kv_heads,
        attributes.head_dim,
        block_m=block_m,
        block_n=block_n,
        num_stages=num_stages,
    )
    constants = triton_tiles.kernel_constants(
        config,
        **attributes.kernel_arguments(),
        block_size=attributes.block_size,
        cache_quant={"auto": "none"}.get(attributes.kv_cache_dtype, attributes.kv_cache_dtype),
    )
    constexprs = {"C": constants, "SPLIT_DECODE": False}  # TensorRT launches one kernel
    signature = kernel_signature(activation_dtype, attributes.kv_cache_dtype)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers} if aligned else None
    source = ASTSource(
        fn=triton_kernel.paged_attention_kernel,
        signature=signature,
        constexprs=constexprs,
        attrs=attrs,
    )
    options = {
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "ptx_version": PTX_ISA[0] * 10 + PTX_ISA[1],
    }
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    metadata = compiled.metadata
    if metadata.global_scratch_size or metadata.profile_scratch_size:
        raise LlmcError(
            f"the paged-attention kernel for sm{arch} needs Triton scratch memory, which "
            "TensorRT's AOT launch does not provide; report this with the layer's attributes"
        )
    ptx = compiled.asm["ptx"]
    if ptx_isa_of(ptx) != PTX_ISA:
        raise LlmcError(f"Triton wrote PTX ISA {ptx_isa_of(ptx)}, not the pinned {PTX_ISA}")
    return AotKernel(
        name=metadata.name,
        ptx=ptx,
        arch=arch,
        num_warps=metadata.num_warps,
        shared_mem=metadata.shared,
        block_m=config.block_m,
    )
