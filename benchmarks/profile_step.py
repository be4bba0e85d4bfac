"""Where a cpu engine's step time goes: ONNX Runtime's profiler on the build's probe steps (a
128-token prefill, a decode of 1 and of 16 sequences), time per operator type.

    python benchmarks/profile_step.py --engine ENGINE [--steps prefill_128,decode_16] [--runs 10]

The engine runs as it serves (``engine.onnx`` with the plugin as a custom op on the CPU EP, or
its segments when it has no graph); per step: the median wall time of ``--runs`` runs after a
warm-up, and each operator type's milliseconds per run and share of the kernels' time (the
profiler's ``*_kernel_time`` events, all runs pooled). Profiling adds a little time to every
kernel; compare shares, and wall times only between runs of this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench_build_scale import host_line  # benchmarks/ is the script's directory

from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps
from llmc.engine.manifest import read_manifest
from llmc.runtime.runners.ort_runner import OrtRunner


def op_times(trace_files: list[str]) -> Counter:
    """Microseconds per operator type over every kernel event of the traces."""
    totals: Counter = Counter()
    for path in trace_files:
        for event in json.loads(Path(path).read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                totals[event["args"]["op_name"]] += event["dur"]
    return totals


def profile(engine: Path, step_name: str, runs: int, top: int) -> dict:
    """One step of ``engine`` ``runs`` times under the profiler; its figures."""
    m = read_manifest(engine)
    probes = probe_steps(m.block_size, m.vocab_size, m.max_seq_len, m.max_num_tokens, m.max_batch)
    step = probes.steps[step_name]
    with tempfile.TemporaryDirectory() as tmp:
        runner = OrtRunner(engine, probes.num_blocks, profile_file_prefix=f"{tmp}/trace")
        runner.execute(step)  # warm-up
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            runner.execute(step)
            seconds.append(time.perf_counter() - start)
        totals = op_times(runner.end_profiling())
    kernel_us = sum(totals.values())
    return {
        "step": step_name,
        "median_ms": 1e3 * statistics.median(seconds),
        "ops": [
            {"op": op, "ms_per_run": us / 1e3 / (runs + 1), "share": us / kernel_us}
            for op, us in totals.most_common(top)
        ],
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--steps", default="prefill_128,decode_1,decode_16")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=12, help="operator types shown per step")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(host_line())
    results = [profile(args.engine, s, args.runs, args.top) for s in args.steps.split(",")]
    for r in results:
        print(f"\n{r['step']}: median {r['median_ms']:.1f} ms\n")
        print("| operator | ms per run | share of kernel time |\n|---|---|---|")
        for op in r["ops"]:
            print(f"| {op['op']} | {op['ms_per_run']:.2f} | {100 * op['share']:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps({"host": host_line(), "steps": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
