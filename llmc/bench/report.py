"""Present a `BenchRun`: a rich table for people, JSON for CI."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
from dataclasses import asdict
from pathlib import Path

from rich.console import Group
from rich.table import Table

from llmc.bench.runner import BenchRun

JSON_FORMAT_VERSION = 1


def run_to_dict(run: BenchRun) -> dict:
    """The JSON document of a run: ``format_version``, ``model``, ``config``, ``result`` (the
    `BenchResult` fields; latencies in ms), ``spec_decode`` (the server's speculative-decoding
    counts over the run and their acceptance rate, or null) and ``requests`` (per request:
    success, error, disconnected, response_id, ttft_ms, latency_ms, itl_ms, prompt_tokens,
    output_tokens, finish_reason). The API key is left out; an infinite request rate is
    written as "inf"."""
    config = asdict(run.config)
    config["api_key"] = None if config["api_key"] is None else "***"
    if math.isinf(config["request_rate"]):
        config["request_rate"] = "inf"

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000.0

    requests = [
        {
            "success": r.success,
            "error": r.error,
            "error_detail": r.error_detail,
            "disconnected": r.disconnected,
            "response_id": r.response_id,
            "ttft_ms": ms(r.ttft),
            "latency_ms": ms(r.latency),
            "itl_ms": [gap * 1000.0 for gap in r.itl],
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "finish_reason": r.finish_reason,
        }
        for r in run.requests
    ]
    spec = run.spec_decode
    return {
        "format_version": JSON_FORMAT_VERSION,
        "model": run.model,
        "config": config,
        "result": run.result.to_dict(),
        "spec_decode": None
        if spec is None
        else {**asdict(spec), "acceptance_rate": spec.acceptance_rate},
        "requests": requests,
    }


def write_json(run: BenchRun, path: str | Path) -> None:
    """Write `run_to_dict` to ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run_to_dict(run), indent=2) + "\n")


def result_table(run: BenchRun) -> Group:
    """Two tables, as vLLM prints its summary: counts and throughputs, then the mean and the
    percentiles of TTFT, TPOT, ITL and end-to-end latency."""
    r = run.result
    path = "/v1/completions" if run.config.endpoint == "completions" else "/v1/chat/completions"
    summary = Table(title=f"llmc bench: {run.model}, {path}")
    first_errors: dict[str, str] = {}
    for request in run.requests:
        if request.error is not None and not request.disconnected:
            first_errors.setdefault(request.error, request.error_detail[:200])
    if first_errors:
        summary.caption = "\n".join(f"{k}: {v}" for k, v in sorted(first_errors.items()))
    summary.add_column("")
    summary.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("successful requests", str(r.completed)),
        ("failed requests", str(r.failed)),
    ]
    rows += [(f"  errors: {kind}", str(n)) for kind, n in sorted(r.errors.items())]
    if r.disconnected:
        rows.append(("disconnected by the client", str(r.disconnected)))
    rows += [
        ("duration (s)", f"{r.duration_s:.2f}"),
        ("total input tokens", str(r.total_input_tokens)),
        ("total output tokens", str(r.total_output_tokens)),
        ("request throughput (req/s)", f"{r.request_throughput:.2f}"),
        ("output token throughput (tok/s)", f"{r.output_throughput:.2f}"),
        ("total token throughput (tok/s)", f"{r.total_token_throughput:.2f}"),
        ("peak concurrent requests", str(r.max_concurrency_seen)),
    ]
    spec = run.spec_decode
    if spec is not None and spec.num_drafts:
        rows += [
            ("speculative: drafted tokens", f"{spec.num_draft_tokens:.0f}"),
            ("speculative: accepted tokens", f"{spec.num_accepted_tokens:.0f}"),
            ("speculative: acceptance rate", f"{spec.acceptance_rate:.3f}"),
            ("speculative: tokens per verification", f"{spec.mean_accepted_length:.2f}"),
        ]
    for name, value in rows:
        summary.add_row(name, value)
    latencies = Table()
    latencies.add_column("latency (ms)")
    for column in ("mean", *r.ttft_ms.percentiles):
        latencies.add_column(column, justify="right")
    for label, stats in (
        ("TTFT", r.ttft_ms),
        ("TPOT (excl. 1st token)", r.tpot_ms),
        ("ITL", r.itl_ms),
        ("E2E latency", r.e2el_ms),
    ):
        values = (stats.mean, *stats.percentiles.values())
        latencies.add_row(label, *(f"{v:.2f}" for v in values))
    return Group(summary, latencies)


def write_engine_benchmark(
    path: str | Path, benchmark: str, args: argparse.Namespace, runs: object, **extra: object
) -> None:
    """The JSON record of a benchmark script run against one engine (``args.engine``): its
    name, UTC date, host, engine path, workload (``args`` but the engine and ``args.json``),
    ``runs`` and ``extra`` fields."""
    doc = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "engine": str(Path(args.engine).resolve()),
        "workload": {k: v for k, v in vars(args).items() if k not in ("engine", "json")},
        "runs": runs,
        **extra,
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
