"""Resident memory each execution-provider candidate adds while the build measures it, per
engine weight byte: what ``provider_choice``'s load factors estimate.

Each (engine, provider) runs in a fresh process (its ``VmHWM`` is its own): the runner is made
as the build's provider choice makes it (``cpu_runner``) and runs the probe steps of the
engine's limits (``provider_timing.probe_steps``: a prefill of up to 128 tokens, decode at
batch 1 and 16). Prints one Markdown row per pair: the engine's bytes, the peak the process
added over its RSS before the runner, and that peak over the bytes.

    python benchmarks/provider_load.py engines/def-int8 engines/def-int4 \\
        --providers CPUExecutionProvider CPUExecutionProvider+OpenVINORuntime
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench_build_scale import host_line

from llmc.engine.provider import CPU_EP, HYBRID


def measure(engine_dir: Path, provider: str) -> tuple[int, int]:
    """(engine bytes, peak bytes added) of ``provider`` on ``engine_dir``, in this process."""
    import psutil

    from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps, time_steps
    from llmc.engine.manifest import read_manifest
    from llmc.engine.provider import ProviderChoice
    from llmc.runtime.runners.cpu_runner import cpu_runner

    m = read_manifest(engine_dir)
    probe = probe_steps(m.block_size, m.vocab_size, m.max_seq_len, m.max_num_tokens, m.max_batch)
    weights = sum(f.stat().st_size for f in engine_dir.rglob("*") if f.is_file())
    before = psutil.Process().memory_info().rss
    runner = cpu_runner(engine_dir, probe.num_blocks, 2, ProviderChoice(provider, "f32"))
    time_steps(runner, probe)
    return weights, _high_water_mark() - before


def _high_water_mark() -> int:
    """This process's peak resident bytes (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv: list[str]) -> int:
    """Measure each of ``--providers`` on each engine directory, each pair in a child process
    (``--one``), and print the table; returns 0. Raises CalledProcessError when a child fails
    (a provider that cannot run here)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--providers", nargs="+", default=[CPU_EP, HYBRID])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # engine, provider: a child
    args = parser.parse_args(argv)
    if args.one:
        weights, added = measure(Path(args.one[0]), args.one[1])
        print(weights, added)
        return 0
    print(host_line())
    print("| engine | provider | engine MB | peak added MB | x engine bytes |")
    print("|---|---|---|---|---|")
    for engine in args.engines:
        for provider in args.providers:
            child = [sys.executable, __file__, str(engine), "--one", str(engine), provider]
            out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
            weights, added = (int(v) for v in out.split()[-2:])
            row = f"| {engine.name} | {provider} | {weights / 1e6:,.0f} | {added / 1e6:,.0f} |"
            print(f"{row} {added / weights:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
