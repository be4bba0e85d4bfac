"""Sweep the Triton paged-attention kernel's tiles and launch options on an NVIDIA GPU (needs
torch with CUDA).

    python benchmarks/bench_triton_tiles.py                                # tiles
    python benchmarks/bench_triton_tiles.py --block-m def --block-n 32 --warps 4,8 --stages 1,2,3

For each workload (ci/gpu_acceptance.py's shapes and steps), the kernel's time with each
``block_m`` (new tokens per program; ``def``: the launcher's choice) x ``block_n`` (keys per
softmax update) x ``num_warps`` x ``num_stages`` (Triton's software-pipelining depth of the key
loop), against ``scaled_dot_product_attention`` on the same data gathered dense. Times are
``triton.testing.do_bench`` medians in ms (launcher's Python work included: it is paid per
call in serving too); the launch overhead alone is the time of a one-token, one-key step.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))

from gpu_acceptance import REAL_SHAPES, Workload, dense_sdpa, kwargs_of, make_step  # noqa: E402

from llmc.plugins.paged_attention.triton_launch import paged_attention_triton  # noqa: E402

WORKLOADS = (
    Workload("prefill 1x4096", ((4096, 4096),)),
    Workload("chunk 512 of 4096", ((4096, 512),)),
    Workload("decode 16x32768", ((32768, 1),) * 16),
    Workload("decode 64x32768", ((32768, 1),) * 64),
    Workload("decode 1x1 (overhead)", ((1, 1),)),
)


def _ints(text: str) -> list[int | None]:
    """'def,16,32' -> [None, 16, 32] (``def``: the launcher's choice)."""
    return [None if t == "def" else int(t) for t in text.split(",")]


def main() -> None:
    """Print one line per (shape, workload): ms per (block_m, block_n, warps, stages) and SDPA's."""
    import triton.testing

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--block-m", type=_ints, default=_ints("def,16,32"))
    p.add_argument("--block-n", type=_ints, default=_ints("32,64"))
    p.add_argument("--warps", type=_ints, default=_ints("4"))
    p.add_argument("--stages", type=_ints, default=_ints("3"))
    p.add_argument("--workloads", default="", help="comma-separated substrings (default: all)")
    args = p.parse_args()
    wanted = [w for w in args.workloads.split(",") if w]
    workloads = [w for w in WORKLOADS if not wanted or any(x in w.name for x in wanted)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    dtype = torch.bfloat16
    choices = list(itertools.product(args.block_m, args.block_n, args.warps, args.stages))
    for shape in (REAL_SHAPES[0], REAL_SHAPES[2]):
        for workload in workloads:
            step = make_step(shape, workload, dtype, torch.device("cuda"), 16, seed=1)
            kwargs = kwargs_of(shape)
            out = torch.empty_like(step[0])
            results = {}
            for block_m, block_n, warps, stages in choices:
                launch = dict(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages)
                try:
                    call = functools.partial(
                        paged_attention_triton, *step, **kwargs, **launch, out=out
                    )
                    result = triton.testing.do_bench(call)
                except Exception as error:  # a tile that does not fit or compile
                    result = type(error).__name__
                results[(block_m, block_n, warps, stages)] = result
            run, _ = dense_sdpa(shape, workload, step, step[3], step[4])
            sdpa = triton.testing.do_bench(run)
            cells = "  ".join(
                f"m{m or 'def'}/n{n}/w{w}/s{st}=" + (f"{v:.3f}" if isinstance(v, float) else v)
                for (m, n, w, st), v in results.items()
            )
            print(f"{shape.name} {workload.name}: SDPA={sdpa:.3f}  {cells}", flush=True)


if __name__ == "__main__":
    main()
