"""Time the CPU paged-attention kernel against the torch reference on one Gemma-3-270M-like layer.

    python benchmarks/bench_paged_attention.py   # after `pip install -e .` (or PYTHONPATH=.)

Layer: H=4 query heads, KVH=1 (MQA), D=256, block size 16, blocks shuffled in a 1024-block pool.
Steps: decode of 16 sequences with 256 context tokens each; one 128-token prefill (the TTFT
workload of bench_e2e.py); one 512-token prefill.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from llmc.plugins.paged_attention.cpu import load_library, paged_attention_cpu
from llmc.plugins.paged_attention.reference import paged_attention_reference

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, POOL_BLOCKS = 4, 1, 256, 16, 1024


def make_step(context_lens: list[int], num_new: list[int], seed: int = 0) -> tuple:
    """Numpy inputs of one step: (q, k, v, key_cache, value_cache, seq_lens, query_start_loc,
    block_tables, slot_mapping)."""
    rng = np.random.default_rng(seed)
    num_tokens, max_blocks = sum(num_new), -(-max(context_lens) // BLOCK_SIZE)
    ids = rng.permutation(POOL_BLOCKS)[: len(context_lens) * max_blocks].astype(np.int32)
    block_tables = ids.reshape(len(context_lens), max_blocks)
    slots = [
        int(block_tables[b, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
        for b, (length, n) in enumerate(zip(context_lens, num_new, strict=True))
        for p in range(length - n, length)
    ]
    kv_pool = rng.standard_normal((2, POOL_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM), np.float32)
    return (
        rng.standard_normal((num_tokens, HEADS * HEAD_DIM), np.float32),
        rng.standard_normal((num_tokens, KV_HEADS * HEAD_DIM), np.float32),
        rng.standard_normal((num_tokens, KV_HEADS * HEAD_DIM), np.float32),
        kv_pool[0],
        kv_pool[1],
        np.array(context_lens, np.int32),
        np.array([0, *np.cumsum(num_new)], np.int32),
        block_tables,
        np.array(slots, np.int64),
    )


def ms_per_call(fn: Callable[[], object], rounds: int = 7, min_seconds: float = 1.0) -> list[float]:
    """Mean ms per call in each of ``rounds`` timed rounds, after a warm-up call."""
    fn()
    times = []
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_seconds / rounds:
            fn()
            calls += 1
        times.append(elapsed / calls * 1e3)
    return times


def main() -> None:
    """Time the kernel and the reference on each step shape; print best and median ms."""
    kwargs = dict(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                  scale=HEAD_DIM**-0.5, sliding_window=None, logit_softcap=None)  # fmt: skip
    print(f"kernel: {load_library().path}")
    env = {name: os.environ.get(name, "unset") for name in ("LLMC_NUM_THREADS", "OMP_NUM_THREADS")}
    print(f"{env}, torch threads={torch.get_num_threads()}, load average={os.getloadavg()}")
    steps = {
        "decode 16 x 256 ctx": make_step([256] * 16, [1] * 16),
        "prefill 128 tokens": make_step([128], [128]),
        "prefill 512 tokens": make_step([512], [512]),
        "decode 1 x 1 ctx (overhead)": make_step([1], [1]),
    }
    # Why best and median: on a shared 2-core machine other processes inflate some rounds; the
    # best round is what the code costs, the median what a busy host sees.
    print(f"{'ms per call (best / median)':<30}{'C kernel':>16}{'reference':>18}{'speedup':>9}")
    for name, arrays in steps.items():
        out = np.empty_like(arrays[0])
        tensors = [torch.from_numpy(a) for a in arrays]  # shares memory: same in-place writes
        kernel = ms_per_call(lambda a=arrays, o=out: paged_attention_cpu(*a, **kwargs, out=o))
        reference = ms_per_call(lambda t=tensors: paged_attention_reference(*t, **kwargs))
        k_best, k_median = min(kernel), statistics.median(kernel)
        r_best, r_median = min(reference), statistics.median(reference)
        print(f"{name:<30}{k_best:>7.3f} / {k_median:<7.3f}{r_best:>8.3f} / {r_median:<8.3f}"
              f"{r_best / k_best:>7.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
