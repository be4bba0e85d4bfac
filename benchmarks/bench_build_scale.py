"""Build memory and time against model size: ``llmc build`` on each rung of the size ladder.

Each build runs as its own ``llmc build`` process; a sampler reads the resident set size of
that process and all its children (psutil, every 0.1 s) and keeps the peak. Reported per rung
and quantization: parameters, checkpoint bytes, engine bytes, peak RSS, wall time, and the
per-stage wall times the engine's manifest records (``build_stats``) where it has them.

    python benchmarks/make_size_ladder.py --out /tmp/ladder
    python benchmarks/bench_build_scale.py --ladder /tmp/ladder --quants none,int8,int4 \\
        --json build_scale.json

A build that fails is reported with its exit code and the last line of its error output, so
one rung's failure does not hide the others.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: ``llmc build``'s exit code for a portable stage written on a host that cannot finish it,
#: and the stage's manifest (``llmc.engine.stage.STAGE_NAME``).
STAGE_EXIT, STAGE_MANIFEST = 2, "stage.json"
#: The size bar: a build's peak RSS at most its engine's bytes and this.
BAR_EXTRA_BYTES = 2 << 30


@dataclass
class BuildRun:
    """One measured build."""

    rung: str
    quant: str
    arch: str
    parameters: int
    checkpoint_bytes: int
    exit_code: int
    wall_s: float
    peak_rss_bytes: int
    engine_bytes: int | None = None
    stages: dict[str, dict] = field(default_factory=dict)
    error: str | None = None


def tree_rss(proc) -> int:
    """Resident bytes of ``proc`` (a ``psutil.Process``) and all its descendants."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_build(cmd: list[str], interval_s: float = 0.1) -> tuple[int, float, int, str]:
    """Run ``cmd``; return (exit code, wall seconds, peak tree RSS bytes, stderr tail)."""
    import psutil

    start = time.perf_counter()
    popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(popen.pid)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                peak = max(peak, tree_rss(proc))
            except psutil.Error:
                return
            stop.wait(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = popen.communicate()
    stop.set()
    sampler.join()
    tail = [line for line in err.strip().splitlines() if line.strip()][-1:] or [""]
    return popen.returncode, time.perf_counter() - start, peak, tail[0]


def checkpoint_facts(ckpt: Path) -> tuple[int, int]:
    """(parameters, bytes) of a safetensors checkpoint directory, from the files' headers."""
    from safetensors import safe_open

    params = nbytes = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        nbytes += f.stat().st_size
        with safe_open(str(f), "np") as st:
            for name in st.keys():
                shape = st.get_slice(name).get_shape()
                n = 1
                for s in shape:
                    n *= s
                params += n
    return params, nbytes


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(rung_dir: Path, quant: str, arch: str, out: Path, extra: list[str]) -> BuildRun:
    """Build ``rung_dir`` with ``--quant quant --arch arch`` into ``out`` and measure it."""
    params, ckpt_bytes = checkpoint_facts(rung_dir)
    cmd = [sys.executable, "-m", "llmc.cli", "build", str(rung_dir), "--quant", quant]
    cmd += ["--arch", arch, "-o", str(out), *extra]
    code, wall, peak, tail = run_build(cmd)
    run = BuildRun(rung_dir.name, quant, arch, params, ckpt_bytes, code, wall, peak)
    # A GPU target on a host without TensorRT and its GPU: the build writes the portable stage
    # and exits 2 (TensorRTUnavailableError); the stage is what is measured.
    staged = code == STAGE_EXIT and (out / STAGE_MANIFEST).is_file()
    if code != 0 and not staged:
        run.error = tail
        return run
    run.engine_bytes = dir_bytes(out)
    if not staged:
        manifest = json.loads((out / "manifest.json").read_text())
        run.stages = manifest.get("build_stats", {}).get("stages", {})
    return run


def host_line() -> str:
    """CPU model and SIMD flags of this host, for the table's heading."""
    model, flags = platform.processor(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                have = set(line.split(":", 1)[1].split())
                flags = " ".join(f for f in wanted if f in have)
                break
    except OSError:
        pass
    import os

    return f"{model}; {os.cpu_count()} cores; {flags}"


def main(argv: list[str] | None = None) -> int:
    """Build every rung x quant, print a Markdown table, optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ladder", required=True, help="directory written by make_size_ladder.py")
    p.add_argument("--rungs", default=None, help="comma-separated rung names (default: all)")
    p.add_argument("--quants", default="none,int8,int4")
    p.add_argument("--arch", default="cpu")
    p.add_argument("--work", default="/tmp/llmc_build_scale", help="engines are written here")
    p.add_argument("--json", default=None)
    p.add_argument("build_args", nargs=argparse.REMAINDER, help="after --: more build flags")
    args = p.parse_args(argv)
    ladder = Path(args.ladder)
    names = args.rungs.split(",") if args.rungs else sorted(d.name for d in ladder.iterdir())
    extra = [a for a in args.build_args if a != "--"]
    runs = []
    print(f"host: {host_line()}")
    columns = "rung params quant exit wall_s peak_RSS_GB engine_GB bar_GB stages_(s)".split()
    print("| " + " | ".join(c.replace("_", " ") for c in columns) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for quant in args.quants.split(","):
            out = Path(args.work) / f"{name}-{args.arch}-{quant}"
            run = measure(ladder / name, quant, args.arch, out, extra)
            runs.append(run)
            stages = ", ".join(f"{k} {v.get('wall_s', 0):.0f}" for k, v in run.stages.items())
            engine = f"{run.engine_bytes / 1e9:.2f}" if run.engine_bytes else "-"
            bar = f"{(run.engine_bytes + BAR_EXTRA_BYTES) / 1e9:.2f}" if run.engine_bytes else "-"
            print(
                f"| {name} | {run.parameters / 1e9:.2f}B | {quant} | {run.exit_code} | "
                f"{run.wall_s:.0f} | {run.peak_rss_bytes / 1e9:.2f} | {engine} | {bar} | "
                f"{stages or run.error or ''} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"host": host_line(), "runs": [asdict(r) for r in runs]}, indent=1)
        )
    return 0 if all(r.error is None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
