"""Sweep the Triton paged-attention kernel's tiles on an NVIDIA GPU (needs torch with CUDA).

    python benchmarks/bench_triton_tiles.py

For each workload (ci/gpu_acceptance.py's shapes and steps), the kernel's time with
``block_m`` (new tokens per program) x ``block_n`` (keys per softmax update), against
``scaled_dot_product_attention`` on the same data gathered dense. Times are
``triton.testing.do_bench`` medians in ms (launcher's Python work included: it is paid per
call in serving too); the launch overhead alone is the time of a one-token, one-key step.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))

from gpu_acceptance import REAL_SHAPES, Workload, dense_sdpa, kwargs_of, make_step  # noqa: E402

from llmc.plugins.paged_attention.triton_launch import paged_attention_triton  # noqa: E402

WORKLOADS = (
    Workload("prefill 1x4096", ((4096, 4096),)),
    Workload("chunk 512 of 4096", ((4096, 512),)),
    Workload("decode 64x32768", ((32768, 1),) * 64),
    Workload("decode 1x1 (overhead)", ((1, 1),)),
)
BLOCK_M_TOKENS = (None, 16, 32)  # None: the launcher's choice (choose_block_m)
BLOCK_N = (32, 64)


def main() -> None:
    """Print one line per (shape, workload): ms per tile choice and SDPA's."""
    import triton.testing

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    dtype = torch.bfloat16
    for shape in (REAL_SHAPES[0], REAL_SHAPES[2]):
        for workload in WORKLOADS:
            step = make_step(shape, workload, dtype, torch.device("cuda"), 16, seed=1)
            kwargs = kwargs_of(shape)
            out = torch.empty_like(step[0])
            results = {}
            for block_m in BLOCK_M_TOKENS:
                for block_n in BLOCK_N:
                    try:
                        tiles = dict(block_m=block_m, block_n=block_n, out=out)
                        call = functools.partial(paged_attention_triton, *step, **kwargs, **tiles)
                        results[(block_m, block_n)] = triton.testing.do_bench(call)
                    except Exception as error:  # a tile that does not fit or compile
                        results[(block_m, block_n)] = f"{type(error).__name__}"
            run, _ = dense_sdpa(shape, workload, step, step[3], step[4])
            sdpa = triton.testing.do_bench(run)
            cells = "  ".join(
                f"m{m or 'def'}/n{n}={v:.3f}" if isinstance(v, float) else f"m{m}/n{n}={v}"
                for (m, n), v in results.items()
            )
            print(f"{shape.name} {workload.name}: SDPA={sdpa:.3f}  {cells}", flush=True)


if __name__ == "__main__":
    main()
