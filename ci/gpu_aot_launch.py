"""The TensorRT AOT kernel launched as TensorRT would launch it, without TensorRT: part 4 of
``ci/gpu_acceptance.py``.

TensorRT's AOT plugin path (``trt_register.paged_attention_aot_impl``) hands the engine a PTX
entry name, the PTX text (``trt_aot.compile_aot``, ISA pinned to ``trt_aot.PTX_ISA``), a grid
(``AotKernel.grid``), ``num_warps * 32`` threads, the dynamic shared memory, and the int32
scalars; the engine loads the PTX with the CUDA driver, which JIT-compiles it for the GPU, and
launches it with the input pointers, the scalars and the output pointers, in that order. This
part does the same through CuPy's driver bindings (``cuModuleLoadData``, ``cuLaunchKernel``) and
compares the result with the torch reference (output within the dtype's tolerance, caches bit
for bit). What it cannot show is what TensorRT itself passes for the hidden scratch pointers
Triton appends to the entry: here they are null, which the kernel allows (``compile_aot`` refuses
kernels that use scratch memory).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

#: The plugin's ``kv_cache_dtype`` -> the torch dtype of the cache's codes (None: the
#: activations' dtype), and the scales the checks quantize with (the tests' values).
CACHE_DTYPES = {"auto": None, "fp8": "float8_e4m3fn", "int8": "int8"}  # torch's names
CACHE_SCALES = {"auto": (1.0, 1.0), "fp8": (0.02, 0.03), "int8": (0.031, 0.027)}


def entry_parameters(ptx: str, name: str) -> int:
    """Number of ``.param`` declarations of the PTX entry ``name``.

    Raises:
        ValueError: the PTX has no such entry.
    """
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(([^)]*)\)", ptx)
    if m is None:
        raise ValueError(f"the PTX has no entry {name!r}")
    return m.group(1).count(".param")


class AotLauncher:
    """One compiled kernel loaded through the CUDA driver (CuPy's ``Module.load``:
    ``cuModuleLoadData`` on the PTX text) and launched with TensorRT's argument order: the 9
    input pointers, ``num_seqs`` and ``max_blocks`` as int32, the 3 output pointers, then a null
    pointer for each hidden parameter Triton appended to the entry."""

    def __init__(self, kernel, num_kv_heads: int, kv_cache_dtype: str = "auto"):
        """``kernel``: a ``trt_aot.AotKernel``; ``kv_cache_dtype``: the cache it was compiled
        for (a key of :data:`CACHE_DTYPES`)."""
        import cupy

        from llmc.plugins.paged_attention import triton_kernel as tk

        self.kernel = kernel
        self.kv_cache_dtype = kv_cache_dtype
        self.num_kv_heads = num_kv_heads
        self.module = cupy.cuda.function.Module()
        self.module.load(kernel.ptx.encode())
        self.function = self.module.get_function(kernel.name)
        self.declared = len(tk.POINTER_INPUTS) + len(tk.SCALAR_INPUTS) + len(tk.POINTER_OUTPUTS)
        self.hidden = entry_parameters(kernel.ptx, kernel.name) - self.declared

    def __call__(self, step: Sequence, out) -> None:
        """Launch on ``step`` (the plugin's 9 inputs as CUDA torch tensors), writing ``out``
        ([T, H*D], q's dtype) and the caches in place, on the null stream."""
        import numpy as np

        q, seq_lens, block_tables = step[0], step[5], step[7]
        pointers = [np.uint64(t.data_ptr()) for t in step]
        scalars = [np.int32(seq_lens.shape[0]), np.int32(block_tables.shape[1])]
        outputs = [np.uint64(t.data_ptr()) for t in (out, step[3], step[4])]
        hidden = [np.uint64(0)] * self.hidden
        grid = self.kernel.grid(q.shape[0], seq_lens.shape[0], self.num_kv_heads)
        self.function(
            (*grid, 1),
            (self.kernel.num_warps * 32, 1, 1),
            (*pointers, *scalars, *outputs, *hidden),
            shared_mem=self.kernel.shared_mem,
        )


def cache_difference(got, want) -> str:
    """'' when two caches are equal bit for bit, else how many bytes differ and the first
    differing code of each (written by the kernel, by the reference)."""
    import torch

    a, b = got.view(torch.uint8).flatten(), want.view(torch.uint8).flatten()
    bad = (a != b).nonzero()
    if bad.numel() == 0:
        return ""
    i = int(bad[0])
    return (f"caches: {bad.numel()} of {a.numel()} bytes differ, first at byte {i}: "
            f"{int(a[i]):#04x} against the reference's {int(b[i]):#04x}")  # fmt: skip


def aot_case(
    launcher: AotLauncher,
    shape,
    workload,
    dtype_name: str,
    kwargs: dict,
    *,
    make_step: Callable,
    time_ms: Callable,
    tolerance: tuple[float, float],
    block_size: int,
    repeat: int,
) -> tuple[bool, str]:
    """One workload through ``launcher``: (passed, the printed row's tail: max abs error, AOT
    and torch-launcher ms, verdict)."""
    import torch

    from llmc.plugins.paged_attention.reference import paged_attention_reference, quantize_kv
    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton

    step = make_step(shape, workload, getattr(torch, dtype_name), "cuda", block_size, seed=7)
    codes = CACHE_DTYPES[launcher.kv_cache_dtype]
    if codes is not None:  # the cache's old tokens as codes, as the engine stores them
        step[3] = quantize_kv(step[3], getattr(torch, codes), kwargs["k_scale"])
        step[4] = quantize_kv(step[4], getattr(torch, codes), kwargs["v_scale"])
    reference_step = [t.clone() for t in step]
    out = torch.empty_like(step[0])
    torch.cuda.synchronize()
    launcher(step, out)
    torch.cuda.synchronize()
    with torch.device("cuda"):
        expected = paged_attention_reference(*reference_step, **kwargs)
    atol, rtol = tolerance
    error = (out.float() - expected.float()).abs()
    close = bool((error <= atol + rtol * expected.float().abs()).all())
    differ = [cache_difference(a, b) for a, b in ((step[3], reference_step[3]),
                                                  (step[4], reference_step[4]))]  # fmt: skip
    same = not any(differ)
    aot_ms = time_ms(lambda: launcher(step, out), repeat, True)
    torch_ms = time_ms(lambda: paged_attention_triton(*step, **kwargs, out=out), repeat, True)
    faults = ([] if close else ["output"]) + [d for d in differ if d]
    verdict = "FAIL: " + "; ".join(faults) if faults else "ok"
    return close and same, f"{error.max().item():>10.2e}{aot_ms:>9.3f}{torch_ms:>10.3f}  {verdict}"


def aot_part(
    shapes: Sequence,
    workloads: Sequence,
    dtypes: Sequence[str],
    arch: int,
    *,
    make_step: Callable,
    kwargs_of: Callable,
    time_ms: Callable,
    tolerance: dict[str, tuple[float, float]],
    block_size: int,
    repeat: int,
    caches: Sequence[str] = ("auto",),
) -> bool:
    """Compile, load and launch the AOT kernel for each shape x dtype x KV cache dtype
    (``caches``: keys of :data:`CACHE_DTYPES`) on ``sm{arch}`` and check every workload against
    the reference; print one row per case. True when all pass."""
    from llmc.engine.plugin import PluginAttributes
    from llmc.plugins.paged_attention.trt_aot import compile_aot

    print(f"\nAOT kernel (TensorRT's launch through the CUDA driver), sm{arch}; ms: CUDA events")
    print(f"{'shape':<22}{'dtype':<10}{'cache':<6}{'workload':<24}{'params':>7}{'smem':>7}"
          f"{'max err':>10}{'AOT ms':>9}{'torch ms':>10}")  # fmt: skip
    ok = True
    for shape in shapes:
        for cache in caches:
            k_scale, v_scale = CACHE_SCALES[cache]
            kwargs = {**kwargs_of(shape), "k_scale": k_scale, "v_scale": v_scale}
            attributes = PluginAttributes(
                shape.num_heads, shape.num_kv_heads, shape.head_dim, kwargs["scale"],
                shape.sliding_window or 0, shape.logit_softcap or 0.0, block_size, 0, cache,
                k_scale, v_scale,
            )  # fmt: skip
            for dtype_name in dtypes:
                kernel = compile_aot(attributes, dtype_name, arch)
                launcher = AotLauncher(kernel, shape.num_kv_heads, cache)
                for workload in workloads:
                    passed, tail = aot_case(
                        launcher, shape, workload, dtype_name, kwargs, make_step=make_step,
                        time_ms=time_ms, tolerance=tolerance[dtype_name],
                        block_size=block_size, repeat=repeat,
                    )  # fmt: skip
                    ok &= passed
                    params = f"{launcher.declared}+{launcher.hidden}"
                    print(f"{shape.name:<22}{dtype_name:<10}{cache:<6}{workload.name:<24}"
                          f"{params:>7}{kernel.shared_mem:>7}{tail}")  # fmt: skip
    return ok
