"""Step times of two or more cpu engines, interleaved in one process, in both orders.

    python benchmarks/compare_engines.py ENGINE_A ENGINE_B [--steps prefill_128,decode_1]
        [--rounds 25]

Each engine runs the build's probe steps
(``llmc.compiler.backends.onnxruntime.provider_timing.probe_steps``: a
128-token prefill, decodes of 1 and 16 sequences) through its single graph, as it serves. A
round runs every engine once per step; the medians over ``--rounds`` rounds are printed for the
engines in the given order and again in reverse order, with each engine's time over the first
engine's. Why both orders: on these 2-core VMs the engine measured later in a round gains up to
4-7% (two copies of one graph differed that much), so a ratio under ~10% from one order is not
a result; the mean of the two orders' ratios is. Also prints whether the engines' logits agree
(max |difference|, same argmax) on each step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from bench_build_scale import host_line  # benchmarks/ is the script's directory

from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps
from llmc.engine.manifest import read_manifest
from llmc.runtime.runners.ort_runner import OrtRunner


def medians(runners: list[OrtRunner], step, rounds: int) -> list[float]:
    """Median seconds of ``step`` per runner over ``rounds`` rounds, runners in list order."""
    times: list[list[float]] = [[] for _ in runners]
    for _ in range(rounds):
        for i, runner in enumerate(runners):
            start = time.perf_counter()
            runner.execute(step)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", type=Path, nargs="+")
    parser.add_argument("--steps", default="prefill_128,decode_1,decode_16")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    if len(args.engines) < 2:
        parser.error("give two or more engines")
    m = read_manifest(args.engines[0])
    probes = probe_steps(m.block_size, m.vocab_size, m.max_seq_len, m.max_num_tokens, m.max_batch)
    runners = [OrtRunner(e, probes.num_blocks, single_graph=True) for e in args.engines]
    names = [e.name for e in args.engines]
    print(host_line())
    for step_name in args.steps.split(","):
        step = probes.steps[step_name]
        logits = [r.execute(step) for r in runners]  # also the warm-up
        forward = medians(runners, step, args.rounds)
        backward = medians(runners[::-1], step, args.rounds)[::-1]
        for order, t in (("given order", forward), ("reversed order", backward)):
            cells = ", ".join(f"{n} {1e3 * s:.2f} ms" for n, s in zip(names, t, strict=True))
            print(f"{step_name}, {order}: {cells}")
        for i in range(1, len(names)):
            ratio = (forward[i] / forward[0] + backward[i] / backward[0]) / 2
            diff = float(np.abs(logits[i] - logits[0]).max())
            same = bool((logits[i].argmax(-1) == logits[0].argmax(-1)).all())
            print(f"{step_name}: {names[i]} / {names[0]} = {ratio:.3f} (mean of both orders); "
                  f"logits max |diff| {diff:.3g}, same argmax {same}")  # fmt: skip


if __name__ == "__main__":
    main()
