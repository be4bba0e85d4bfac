"""LoRA serving cost: throughput and TTFT of 16 concurrent requests (S16) on an engine built with
``--enable-lora``, its requests on the base model, on 1 adapter and on 4 distinct adapters,
against the same model's engine built without LoRA.

    llmc build gemma-3-270m --quant int8 -o engines/g-int8
    llmc build gemma-3-270m --quant int8 --enable-lora --max-loras 4 --max-lora-rank 16 \
        -o engines/g-int8-lora
    python benchmarks/bench_lora.py --engine engines/g-int8-lora --plain-engine engines/g-int8

Adapters: ``--num-adapters`` (4) random rank-``--rank`` (16) PEFT directories on every module
the engine has slots for (``adapter_config.json`` + ``adapter_model.safetensors`` in PEFT's key
layout, small weights: the cost does not depend on their values), served with
``--lora-modules``. Workload: ``--num-prompts`` (16) prompts of ``--input-len`` (128) token ids,
``--output-len`` (128) tokens each with EOS ignored, all in flight at once; the requests of
case "4 adapters" name the adapters in turn. One warm-up request per server (not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmc.bench import BenchConfig, Target, first_model, run_requests, summarize
from llmc.bench.dataset import load_tokenizer, random_requests
from llmc.bench.report import write_engine_benchmark
from llmc.bench.server_process import ServeProcess
from llmc.engine.manifest import read_manifest


def write_adapter(out: Path, modules: dict, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter directory for the engine's slotted ``modules``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (k, o) in modules.items():
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.01, (rank, k)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.01, (o, rank)).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def run_case(engine: str, serve_args: list[str], requests, warmup) -> dict:
    """One server: warm up, send every request at once, summarize."""
    with ServeProcess(engine, serve_args, startup_timeout_s=600) as server:
        target = Target(server.url, first_model(server.url), ignore_eos=True)
        asyncio.run(run_requests(target, [warmup]))
        results, duration = asyncio.run(
            run_requests(target, requests, max_concurrency=len(requests))
        )
    summary = summarize(results, duration)
    return {
        "completed": summary.completed,
        "failed": summary.failed,
        "output_tok_s": summary.output_throughput,
        "mean_ttft_ms": summary.ttft_ms.mean,
        "p50_ttft_ms": summary.ttft_ms.percentiles["p50"],
        "mean_tpot_ms": summary.tpot_ms.mean,
        "duration_s": duration,
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="engine built with --enable-lora")
    parser.add_argument("--plain-engine", help="the same model built without LoRA")
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    layout = read_manifest(args.engine).lora
    if not layout:
        parser.error(f"{args.engine} has no LoRA slots (build it with --enable-lora)")
    tokenizer = load_tokenizer(args.engine)
    config = BenchConfig(
        num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len
    )
    requests = random_requests(config, tokenizer)
    warmup = random_requests(replace(config, num_prompts=1, seed=1000), tokenizer)[0]
    work = Path(tempfile.mkdtemp(prefix="llmc-lora-bench-"))
    names = [f"adapter{i}" for i in range(args.num_adapters)]
    modules = {m: tuple(shape) for m, shape in layout["modules"].items()}
    lora_args = ["--lora-modules"] + [
        f"{n}={write_adapter(work / n, modules, args.rank, i)}" for i, n in enumerate(names)
    ]
    cases = {}
    if args.plain_engine:
        cases["engine without LoRA"] = (args.plain_engine, [], requests)
    cases["LoRA engine, base model"] = (args.engine, lora_args, requests)
    cases["1 adapter"] = (args.engine, lora_args, [replace(r, model=names[0]) for r in requests])
    mixed = [replace(r, model=names[i % len(names)]) for i, r in enumerate(requests)]
    cases[f"{len(names)} adapters"] = (args.engine, lora_args, mixed)
    runs = {}
    for name, (engine, serve_args, reqs) in cases.items():
        runs[name] = run = run_case(engine, serve_args, reqs, warmup)
        print(
            f"{name:26s} {run['output_tok_s']:7.1f} output tok/s  mean TTFT "
            f"{run['mean_ttft_ms']:8.1f} ms  mean TPOT {run['mean_tpot_ms']:7.1f} ms  "
            f"completed {run['completed']} failed {run['failed']}",
            flush=True,
        )
    if args.json:
        write_engine_benchmark(args.json, "bench_lora", args, runs, cpus=os.cpu_count())


if __name__ == "__main__":
    main()
