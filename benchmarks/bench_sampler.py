"""The cost of sampled (temperature > 0) decoding: the ``Sampler`` step alone on random logits,
then ``LLM.generate`` of sampled tokens from BOS on an engine (the way a build samples its
calibration text), tokens per second.

    python benchmarks/bench_sampler.py --engine engines/gemma-int8-default
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_sampler.py ...  # a baseline

Prints the host (``lscpu`` model and SIMD flags) and one line per measurement.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from bench_build_scale import host_line  # benchmarks/ is the script's directory

from llmc.runtime.engine import LLMEngine
from llmc.runtime.sampling.sampler import Sampler
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence


def step_ms(rows: int, vocab: int, seeded: bool, repeats: int) -> float:
    """Median ms of one ``Sampler`` call on [rows, vocab] logits at temperature 1."""
    logits = np.random.default_rng(0).normal(scale=3, size=(rows, vocab)).astype(np.float32)
    seqs = [
        Sequence(
            str(i),
            [3],
            SamplingParams(temperature=1.0, seed=i if seeded else None),
            generator=torch.Generator().manual_seed(i) if seeded else None,
        )
        for i in range(rows)
    ]
    sampler = Sampler(seed=0)
    sampler(logits, seqs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler(logits, seqs)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def generate_tok_s(engine_dir: Path, requests: int, new_tokens: int) -> float:
    """Sampled tokens per second of ``requests`` requests from BOS, ``new_tokens`` each."""
    from llmc.runtime.llm import LLM

    engine = LLMEngine.from_engine_dir(
        engine_dir, max_num_seqs=requests, enable_prefix_caching=False
    )
    bos = engine.tokenizer.bos_token_id
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, min_tokens=new_tokens)
        for i in range(requests)
    ]
    llm = LLM.from_engine(engine)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": [bos]}] * requests, params)
    return requests * new_tokens / (time.perf_counter() - start)


def main() -> None:
    """Print the host, the median ``Sampler`` step (ms, [--rows, --vocab] float32 logits, shared
    generator and a seed per request) and, with ``--engine``, sampled ``LLM.generate`` tok/s."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, help="also time LLM.generate on this engine")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"host: {host_line()}")
    for seeded in (False, True):
        ms = step_ms(args.rows, args.vocab, seeded, args.repeats)
        label = "a seed per request" if seeded else "shared generator"
        print(f"Sampler step, {args.rows} x {args.vocab}, {label}: {ms:.1f} ms (median)")
    if args.engine is not None:
        tok_s = generate_tok_s(args.engine, args.rows, args.new_tokens)
        print(f"LLM.generate, {args.rows} sampled requests x {args.new_tokens}: {tok_s:.1f} tok/s")


if __name__ == "__main__":
    main()
