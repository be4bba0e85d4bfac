"""Peak resident memory of each stage of one ``llmc build``, against the size bar.

Runs the build in this process with a ``BuildStats`` as its progress, so every stage's wall time
and peak RSS (psutil, every 0.05 s) are recorded whatever the target. A GPU target's build on a
host without TensorRT stops after its portable stage (``TensorRTUnavailableError``), written to
``-o``, and the stage is what is measured. Prints one Markdown row per stage, then the output's
bytes and the bar (those bytes + 2 GiB).

    python benchmarks/build_stage_memory.py gemma-3-270m --arch sm89 --quant fp8 -o /tmp/stage
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_build_scale import host_line

from llmc.cli import build_parser
from llmc.compiler.backends.tensorrt.finish import TensorRTUnavailableError
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.stages.build_stats import BuildStats
from llmc.compiler.stages.progress import BuildProgress

BAR_EXTRA_BYTES = 2 << 30


def main(argv: list[str]) -> int:
    """Build as ``llmc build ARGV`` says (with ``-o``) and print each stage's wall time and
    peak RSS, the output's bytes and the bar."""
    args = build_parser().parse_args(["build", *argv])
    skip = ("command", "config", "print_config", "from_stage", "log_format")
    flags = {k: v for k, v in vars(args).items() if k not in skip}
    config = BuildConfig.from_sources(args.config, flags)
    if config.destination.output is None:
        raise SystemExit("give -o: the output measured (an engine, or a GPU target's stage)")
    out = Path(config.destination.output)
    with BuildProgress(args.log_format) as progress:  # a line per stage in a log
        stats = BuildStats(progress.stage)
        try:
            build(config, stats)
        except TensorRTUnavailableError:
            pass  # the portable stage is written to -o
    print(f"host: {host_line()}; command: llmc build {' '.join(argv)}")
    print("| stage | wall s | peak RSS GB |")
    print("|---|---|---|")
    for name, s in stats.stages.items():
        print(f"| {name} | {s.wall_s:.1f} | {s.peak_rss_bytes / 1e9:.2f} |")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    peak = max(s.peak_rss_bytes for s in stats.stages.values())
    bar = size + BAR_EXTRA_BYTES
    verdict = "within" if peak <= bar else "over"
    print(f"output {out}: {size / 1e9:.3f} GB; bar {bar / 1e9:.2f} GB; peak {peak / 1e9:.2f} GB")
    print(f"peak {verdict} the bar")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
