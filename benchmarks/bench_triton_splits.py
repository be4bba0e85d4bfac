"""Sweep the flash-decoding split count of the Triton paged-attention kernel on an NVIDIA GPU.

    python benchmarks/bench_triton_splits.py                # needs torch with CUDA, triton

For decode steps of Llama-3-8B (8 KV heads) and Gemma 3 270M's global layers (1 KV head) at
batch 1/16/64 and 4096/32768 keys: the kernel's time with each split count of ``SPLITS``,
with ``choose_num_splits``'s choice, and ``scaled_dot_product_attention``'s on the same data
gathered dense. Times are ``triton.testing.do_bench`` medians in ms (the launcher's Python
work included: serving pays it per call too); ``GB/s`` is the KV cache bytes a step reads
over the best split's time. A decode step is bound by those bytes, so the split count that
reads them fastest is the one to choose.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))

from gpu_acceptance import REAL_SHAPES, Workload, dense_sdpa, kwargs_of, make_step  # noqa: E402

from llmc.plugins.paged_attention.triton_launch import paged_attention_triton  # noqa: E402
from llmc.plugins.paged_attention.triton_tiles import choose_num_splits  # noqa: E402

SPLITS = (1, 2, 4, 8, 16, 32, 64)
BATCHES = (1, 16, 64)
CONTEXTS = (4096, 32768)
BLOCK_SIZE = 16


def main() -> None:
    """Print one line per (shape, batch, context): ms per split count, the heuristic's, SDPA's."""
    import triton.testing

    device = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {num_sms} SMs, torch {torch.__version__}")
    dtype = torch.bfloat16
    for shape in (REAL_SHAPES[0], REAL_SHAPES[2]):
        for batch in BATCHES:
            for context in CONTEXTS:
                workload = Workload(f"decode {batch}x{context}", ((context, 1),) * batch)
                step = make_step(shape, workload, dtype, device, BLOCK_SIZE, seed=1)
                call = functools.partial(
                    paged_attention_triton, *step, **kwargs_of(shape), out=torch.empty_like(step[0])
                )
                times = {s: triton.testing.do_bench(functools.partial(call, num_splits=s))
                         for s in SPLITS}  # fmt: skip
                chosen = choose_num_splits(batch, shape.num_kv_heads, context, num_sms)
                heuristic = triton.testing.do_bench(functools.partial(call, num_splits=chosen))
                run, _ = dense_sdpa(shape, workload, step, step[3], step[4])
                sdpa = triton.testing.do_bench(run)
                best = min(times, key=times.get)
                kv_bytes = batch * context * shape.num_kv_heads * shape.head_dim * 2 * 2
                cells = "  ".join(f"s{s}={t:.3f}" for s, t in times.items())
                print(
                    f"{shape.name} {workload.name}: {cells}  heuristic s{chosen}={heuristic:.3f}"
                    f"  best s{best} {kv_bytes / times[best] / 1e6:.0f} GB/s  SDPA={sdpa:.3f}",
                    flush=True,
                )
                del step, call, run
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
