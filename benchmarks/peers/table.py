"""Print the Markdown table of a run_all.sh output directory: per system, S1 TTFT ms, S1 decode
tok/s, S16 total output tok/s and S16 mean TTFT ms.

    python benchmarks/peers/table.py OUT_DIR [OUT_DIR ...]

With several output directories (runs of run_all.sh), each cell is the median of the runs' cells,
their values in brackets, and the bars are judged on the medians.

``llmc bench`` JSON pairs (``NAME_c1.json``, ``NAME_c16.json``: llmc engines and llama.cpp)
give S1 decode as 1000 / mean TPOT; OpenVINO GenAI's JSON (``openvino_*.json``) as measured by
openvino_genai_bench.py (its ``LLMPipeline`` S1 on a row of its own, S16 columns blank). A
``llmc_NAME_again`` row (run_all.sh serves its first engine again after the peers) is printed
and kept out of the bars: its ratio to ``llmc_NAME`` per column is the host's drift over the run.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def bench_row(c1: dict, c16: dict) -> tuple[float, float, float, float]:
    """(S1 TTFT ms, S1 decode tok/s, S16 total tok/s, S16 mean TTFT ms) of two llmc bench runs."""
    s1, s16 = c1["result"], c16["result"]
    return (
        s1["ttft_ms"]["mean"],
        1000.0 / s1["tpot_ms"]["mean"],
        s16["output_throughput"],
        s16["ttft_ms"]["mean"],
    )


def rows_of(out: Path) -> list[tuple[str, tuple[float, ...]]]:
    """Per system of one run_all.sh output directory: (name, its four cells)."""
    rows = []
    for c1_path in sorted(out.glob("*_c1.json")):
        name = c1_path.name.removesuffix("_c1.json")
        c16_path = out / f"{name}_c16.json"
        if c16_path.exists():
            rows.append((name, bench_row(json.loads(c1_path.read_text()),
                                         json.loads(c16_path.read_text()))))  # fmt: skip
    for path in sorted(out.glob("openvino_*.json")):
        r = json.loads(path.read_text())
        row = (r["s1"]["mean_ttft_ms"], r["s1"]["decode_tok_s"], r["s16"]["total_tok_s"],
               r["s16"]["mean_ttft_ms"])  # fmt: skip
        rows.append((path.stem, row))
        if "s1_llm_pipeline" in r:  # OpenVINO's one-stream path: S1 columns only
            llm = r["s1_llm_pipeline"]
            nan = float("nan")
            rows.append(
                (f"{path.stem} LLMPipeline", (llm["mean_ttft_ms"], llm["decode_tok_s"], nan, nan))
            )
    return rows


def median_rows(runs: list[list[tuple[str, tuple[float, ...]]]]) -> list[tuple[str, tuple]]:
    """Per system present in every run: the median of each cell over the runs, and the runs'
    own cells (a column's median is taken on its own, as the bars compare columns)."""
    names = [n for n, _ in runs[0] if all(n in dict(r) for r in runs)]
    out = []
    for name in names:
        cells = list(zip(*(dict(r)[name] for r in runs), strict=True))
        out.append((name, tuple(statistics.median(c) for c in cells), cells))
    return out


def main() -> None:
    """Print the table of one output directory, or of several runs' medians."""
    dirs = [Path(a) for a in sys.argv[1:]]
    runs = [rows_of(d) for d in dirs]
    host = (
        (dirs[0] / "host.txt").read_text().splitlines()[0]
        if (dirs[0] / "host.txt").exists()
        else ""
    )
    print(f"Host: {host}\n")
    if len(runs) > 1:
        print(f"Medians of {len(runs)} runs, each run's value in brackets.\n")
    print("| system | S1 TTFT ms | S1 decode tok/s | S16 total tok/s | S16 mean TTFT ms |")
    print("|---|---|---|---|---|")
    rows = median_rows(runs)
    for name, medians, cells in rows:
        text = []
        for col, (m, each) in enumerate(zip(medians, cells, strict=True)):
            fmt = "{:.1f}" if col == 1 else "{:.0f}"
            if math.isnan(m):
                text.append("")
            elif len(runs) > 1:
                text.append(f"{fmt.format(m)} [{', '.join(fmt.format(v) for v in each)}]")
            else:
                text.append(fmt.format(m))
        print(f"| {name} | " + " | ".join(text) + " |")
    print()
    plain = [(name, medians) for name, medians, _ in rows]
    for line in against_peers([r for r in plain if not r[0].endswith(AGAIN)]):
        print(line)
    for line in drift(plain):
        print(line)


AGAIN = "_again"


def drift(rows: list[tuple[str, tuple[float, ...]]]) -> list[str]:
    """Per ``NAME_again`` row: its cells over ``NAME``'s (1.00 = the host held its speed)."""
    by_name = dict(rows)
    lines = []
    for name, again in rows:
        first = by_name.get(name.removesuffix(AGAIN)) if name.endswith(AGAIN) else None
        if first is not None:
            cells = zip(BARS, again, first, strict=True)
            ratios = ", ".join(f"{label} {a / f:.2f}x" for (label, _, _), a, f in cells)
            lines.append(f"- drift, {name} over its first run: {ratios}")
    return lines


#: The bars of llmc's CPU lead: (column, higher is better, the ratio llmc's best must reach).
BARS = (
    ("S1 TTFT", False, 0.8),
    ("S1 decode", True, 1.2),
    ("S16 total", True, 1.2),
    ("S16 mean TTFT", False, 0.8),
)


def against_peers(rows: list[tuple[str, tuple[float, ...]]]) -> list[str]:
    """Per column: llmc's best engine against the best peer (rows not named ``llmc_*``), the
    ratio and whether it meets the bar."""
    lines = []
    for col, (label, higher, bar) in enumerate(BARS):
        pick = max if higher else min
        cells = [(r[col], n) for n, r in rows if not math.isnan(r[col])]
        ours = [cell for cell in cells if cell[1].startswith("llmc_")]
        peers = [cell for cell in cells if not cell[1].startswith("llmc_")]
        if not ours or not peers:
            continue
        (best, name), (peer, peer_name) = pick(ours), pick(peers)
        ratio = best / peer
        met = ratio >= bar if higher else ratio <= bar
        sign = ">=" if higher else "<="
        lines.append(
            f"- {label}: {name} {best:.1f} against {peer_name} {peer:.1f}: {ratio:.2f}x "
            f"(bar {sign} {bar}x: {'met' if met else 'not met'})"
        )
    return lines


if __name__ == "__main__":
    main()
