"""The CPU paged-attention kernel alone on one prefill, float32 math against bf16 math, in one
process: median milliseconds per call over interleaved rounds.

    python benchmarks/bench_cpu_attention.py [--tokens 128,512] [--heads 4] [--kv-heads 1]
        [--head-dim 256] [--rounds 30]

One sequence's prefill of T tokens over a float32 cache of 16-token blocks (Gemma 3 270M's
shape by default), through the ctypes binding (``paged_attention_cpu``, the kernel's own thread
pool: ``LLMC_NUM_THREADS`` or every core). ``fpmath_mode="bf16"`` runs the prefill tiles on
AMX-BF16 where ``bf16_prefill_available()`` says so, else it equals strict (printed). Also
prints the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_build_scale import host_line  # benchmarks/ is the script's directory

from llmc.plugins.paged_attention.cpu import bf16_prefill_available, paged_attention_cpu

BLOCK_SIZE = 16
MODES = ("strict", "bf16")


def prefill(tokens: int, heads: int, kv_heads: int, head_dim: int) -> tuple[list, dict]:
    """(positional inputs, keyword attributes) of one sequence's T-token prefill."""
    rng = np.random.default_rng(0)
    blocks = -(-tokens // BLOCK_SIZE)
    cache_shape = (blocks, BLOCK_SIZE, kv_heads, head_dim)
    inputs = [
        rng.standard_normal((tokens, heads * head_dim), np.float32),
        rng.standard_normal((tokens, kv_heads * head_dim), np.float32),
        rng.standard_normal((tokens, kv_heads * head_dim), np.float32),
        np.zeros(cache_shape, np.float32),
        np.zeros(cache_shape, np.float32),
        np.array([tokens], np.int32),
        np.array([0, tokens], np.int32),
        rng.permutation(blocks).astype(np.int32)[None, :],
        np.arange(tokens, dtype=np.int64),  # slots: rewritten below through the block table
    ]
    table = inputs[7][0]
    positions = np.arange(tokens)
    inputs[8] = (table[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE).astype(
        np.int64
    )
    attributes = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    attributes |= dict(scale=head_dim**-0.5, sliding_window=None, logit_softcap=None)
    return inputs, attributes


def main() -> None:
    """Command line: see the module docstring. Prints the host, whether the AMX-BF16 path runs,
    and per ``--tokens`` the two medians (ms), their ratio and the outputs' largest difference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(host_line())
    print(f"bf16 prefill tiles on AMX-BF16 here: {bf16_prefill_available()}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs, attributes = prefill(tokens, args.heads, args.kv_heads, args.head_dim)
        outs = {m: paged_attention_cpu(*inputs, **attributes, fpmath_mode=m) for m in MODES}
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                start = time.perf_counter()
                paged_attention_cpu(*inputs, **attributes, fpmath_mode=mode)
                times[mode].append(time.perf_counter() - start)
        strict, bf16 = (1e3 * statistics.median(times[m]) for m in MODES)
        difference = float(np.abs(outs["bf16"] - outs["strict"]).max())
        print(
            f"T={tokens}: strict {strict:.3f} ms, bf16 {bf16:.3f} ms ({bf16 / strict:.2f}x); "
            f"max |difference| {difference:.2e}"
        )


if __name__ == "__main__":
    main()
