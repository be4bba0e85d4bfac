"""An engine at size in the runtime: resident memory after load, and one-stream decode against
the memory-bandwidth limit.

Decode at batch 1 reads every weight once per token, so its ceiling on a CPU is the memory
bandwidth over the weight bytes (weights per token / bandwidth). This script loads ENGINE with
``LLM`` (the runtime ``llmc serve`` uses), reports the process's RSS against the engine's
weight bytes and the KV cache it allocated, decodes ``--new-tokens`` greedy tokens after a
``--prompt-len`` prompt (decode time: the whole request minus a prefill-only request, prefix
caching off), and measures this host's read bandwidth on all cores (torch's ``max`` of a
``--bandwidth-gb`` float32 tensor, best of 5) in the same run.

    python benchmarks/bench_serve_scale.py /tmp/llmc_build_scale/tinyllama-1.1b-cpu-none
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def read_bandwidth(gb: float) -> float:
    """Bytes per second this host reads from memory on all its cores: torch's ``max`` over a
    ``gb``-GB float32 tensor, best of 5 (a read-only stream, as decode's weight reads are)."""
    import os

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    a = torch.ones(int(gb * 1e9) // 4)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a.max()
        best = min(best, time.perf_counter() - start)
    return a.numel() * 4 / best


def weight_bytes(engine_dir: Path) -> int:
    """Bytes of the engine's weight files (the segments' external data)."""
    return sum(p.stat().st_size for p in (engine_dir / "segments").glob("*.data"))


def main(argv: list[str] | None = None) -> int:
    """Load, measure, print one JSON object."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("engine")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--kv-cache-gb", type=float, default=0.5)
    p.add_argument("--bandwidth-gb", type=float, default=1.0)
    args = p.parse_args(argv)

    import psutil

    from llmc.runtime.llm import LLM
    from llmc.runtime.sampling_params import SamplingParams

    engine_dir = Path(args.engine)
    proc = psutil.Process()
    before = proc.memory_info().rss
    start = time.perf_counter()
    # No prefix caching: every run computes its prompt, so TTFT can be subtracted.
    kv_bytes = int(args.kv_cache_gb * (1 << 30))
    llm = LLM(engine_dir, kv_cache_memory=kv_bytes, enable_prefix_caching=False)
    load_s = time.perf_counter() - start
    loaded = proc.memory_info().rss
    prompt = {"prompt_token_ids": [(7 * i) % 1000 + 3 for i in range(args.prompt_len)]}
    greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([prompt], greedy)  # warm: the prompt's shapes
    start = time.perf_counter()
    llm.generate([prompt], greedy)
    ttft = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens + 1, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], params)
    decode_s = time.perf_counter() - start - ttft
    tok_s = args.new_tokens / decode_s
    weights = weight_bytes(engine_dir)
    bandwidth = read_bandwidth(args.bandwidth_gb)
    limit = bandwidth / weights
    print(
        json.dumps(
            {
                "engine": str(engine_dir),
                "weight_bytes": weights,
                "rss_before_load_bytes": before,
                "rss_after_load_bytes": loaded,
                "kv_cache_bytes": int(args.kv_cache_gb * (1 << 30)),
                "load_s": round(load_s, 2),
                "decode_tok_s": round(tok_s, 2),
                "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
                "bandwidth_limit_tok_s": round(limit, 2),
                "fraction_of_limit": round(tok_s / limit, 3),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
