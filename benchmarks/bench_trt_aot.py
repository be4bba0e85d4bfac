"""Time the TensorRT AOT paged-attention kernel's variants on a GPU, launched as TensorRT would
(``ci/gpu_aot_launch.py``: PTX through the CUDA driver), beside the torch launcher.

    python benchmarks/bench_trt_aot.py [--repeat 10]

Variants per shape and workload (bf16): the AOT kernel as ``compile_aot`` makes it (16-row
tiles, 1 stage, pointers 16-byte aligned), the same without the alignment hint, pipelined 3
stages, 64-row tiles with 1 and 3 stages, and ``paged_attention_triton`` (the torch
launcher: per-step tiles, 3 stages, split decode). Prints ms (CUDA events, median) and each
variant's max abs error against the reference. Needs an NVIDIA GPU, torch, triton and CuPy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "ci")]

WORKLOADS = ("prefill 1x4096", "chunk 512 of 4096", "decode 16x32768", "decode 64x4096")


def variants(attributes, shape, arch: int) -> dict:
    """name -> AotKernel for one layer, those an AOT launch can run (48 KB of shared memory)."""
    from llmc.plugins.paged_attention import triton_tiles
    from llmc.plugins.paged_attention.trt_aot import (
        AOT_SHARED_MEMORY_LIMIT,
        compile_aot,
        compile_kernel,
    )

    group_pad = triton_tiles.kernel_config(
        shape.num_heads, shape.num_kv_heads, shape.head_dim
    ).group_pad
    rows64 = max(1, triton_tiles.PREFILL_ROWS // group_pad)
    found = {
        "aot": compile_aot(attributes, "bfloat16", arch),
        "unaligned": compile_kernel(attributes, "bfloat16", arch, None, 32, aligned=False),
        "s3": compile_kernel(attributes, "bfloat16", arch, None, 32, num_stages=3),
        "m64 s1": compile_kernel(attributes, "bfloat16", arch, rows64, 32),
        "m64 s3": compile_kernel(attributes, "bfloat16", arch, rows64, 32, num_stages=3),
    }
    return {n: k for n, k in found.items() if k.shared_mem <= AOT_SHARED_MEMORY_LIMIT}


def workload_row(shape, workload, kwargs: dict, launchers: dict, repeat: int) -> str:
    """One workload through every launcher and the torch launcher: the row's cells."""
    import torch
    from gpu_acceptance import make_step, time_ms

    from llmc.plugins.paged_attention.reference import paged_attention_reference
    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton

    step = make_step(shape, workload, torch.bfloat16, "cuda", 16, seed=7)
    with torch.device("cuda"):
        expected = paged_attention_reference(*[t.clone() for t in step], **kwargs)
    out = torch.empty_like(step[0])
    cells = []
    for name, launcher in launchers.items():
        launcher(step, out)
        torch.cuda.synchronize()
        error = (out.float() - expected.float()).abs().max().item()
        ms = time_ms(lambda launcher=launcher: launcher(step, out), repeat, True)
        cells.append(f"{name} {ms:.3f} ({error:.1e})")
    ms = time_ms(lambda: paged_attention_triton(*step, **kwargs, out=out), repeat, True)
    return " | ".join([*cells, f"torch {ms:.3f}"])


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 3 without a CUDA GPU."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args(argv)
    import torch
    from gpu_acceptance import REAL_SHAPES, kwargs_of, real_workloads
    from gpu_aot_launch import AotLauncher

    from llmc.engine.plugin import PluginAttributes

    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 3
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    print(f"{torch.cuda.get_device_name()} sm{arch}; ms (max abs error against the reference)")
    workloads = [w for w in real_workloads(32768) if w.name in WORKLOADS]
    for shape in (REAL_SHAPES[0], REAL_SHAPES[2]):
        kwargs = kwargs_of(shape)
        attributes = PluginAttributes(
            shape.num_heads, shape.num_kv_heads, shape.head_dim, kwargs["scale"],
            shape.sliding_window or 0, 0.0, 16, 0, "auto", 1.0, 1.0,
        )  # fmt: skip
        launchers = {
            name: AotLauncher(k, shape.num_kv_heads)
            for name, k in variants(attributes, shape, arch).items()
        }
        for workload in workloads:
            print(
                f"{shape.name:<20}{workload.name:<20}"
                + workload_row(shape, workload, kwargs, launchers, args.repeat),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
