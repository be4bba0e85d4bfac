"""OpenVINO GenAI on the workload of ``llmc bench`` (run inside OpenVINO GenAI's own virtual
environment; see openvino_genai.sh): 16 prompts of exactly 128 token ids cut from
tinyshakespeare, 128 new greedy tokens each with EOS ignored, at 1 and at 16 concurrent requests.

    python openvino_genai_bench.py --model OV_MODEL_DIR --tokenizer HF_DIR --json OUT.json

Both scenarios run through ``ContinuousBatchingPipeline`` (OpenVINO's serving scheduler: paged
KV cache, split-fuse prefill): S1 submits the 16 prompts one after another, S16 all at once.
Per request: TTFT (submission to the first token), and for S1 the decode rate after the first
token (``(tokens - 1) / (last - first)``, as `llmc bench` reports 1/TPOT). S1 also runs through
``LLMPipeline`` (one request at a time, OpenVINO GenAI's own TTFT and TPOT from its
``perf_metrics``): its faster one-stream path, so that llmc is compared with OpenVINO's best at
S1. Printed and written as {"s1": {...}, "s16": {...}, "s1_llm_pipeline": {...}} in the units
of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

TEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"


def make_prompts(tokenizer, num: int, prompt_len: int) -> list[list[int]]:
    """``num`` prompts of exactly ``prompt_len`` ids (BOS included) from different offsets."""
    text = TEXT.read_text()
    chars = prompt_len * 8
    stride = (len(text) - chars) // num
    prompts = []
    for i in range(num):
        ids = tokenizer(text[i * stride : i * stride + chars])["input_ids"][:prompt_len]
        if len(ids) != prompt_len:
            raise ValueError(f"prompt {i} has only {len(ids)} tokens")
        prompts.append(ids)
    return prompts


def run(pipe, prompts: list[list[int]], new_tokens: int, concurrent: bool) -> dict:
    """Submit ``prompts`` (all at once, or each after the previous finished) and step the
    pipeline; per-request TTFT and decode rate."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.min_new_tokens = new_tokens
    config.ignore_eos = True
    config.do_sample = False
    ttfts, rates, total_tokens = [], [], 0
    start = time.perf_counter()
    batches = [prompts] if concurrent else [[p] for p in prompts]
    for batch in batches:
        submitted, first, last, counts, handles = {}, {}, {}, {}, {}
        for i, ids in enumerate(batch):
            tensor = ov.Tensor(np.array([ids], dtype=np.int64))
            submitted[i] = time.perf_counter()
            handles[i] = pipe.add_request(i, tensor, config)
            counts[i] = 0
        while pipe.has_non_finished_requests():
            pipe.step()
            now = time.perf_counter()
            for i, handle in handles.items():
                if handle.can_read():
                    made = sum(len(o.generated_ids) for o in handle.read().values())
                    if made:
                        first.setdefault(i, now)
                        last[i] = now
                        counts[i] += made
        for i in handles:
            ttfts.append(first[i] - submitted[i])
            if counts[i] > 1:
                rates.append((counts[i] - 1) / (last[i] - first[i]))
            total_tokens += counts[i]
    wall = time.perf_counter() - start
    return {
        "mean_ttft_ms": 1e3 * statistics.mean(ttfts),
        "median_ttft_ms": 1e3 * statistics.median(ttfts),
        "decode_tok_s": statistics.median(rates) if rates else None,
        "total_tok_s": total_tokens / wall,
        "tokens": total_tokens,
    }


def run_llm_pipeline(model: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """S1 through ``LLMPipeline``: each prompt alone; mean TTFT and decode rate (1000 / mean
    TPOT) from OpenVINO GenAI's ``perf_metrics``."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(model, "CPU")
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = new_tokens
    config.ignore_eos = True
    config.do_sample = False
    warm = ov.Tensor(np.array([prompts[0]], dtype=np.int64))
    pipe.generate(warm, ov_genai.GenerationConfig(max_new_tokens=4))
    ttfts, tpots = [], []
    for ids in prompts[1:]:
        result = pipe.generate(ov.Tensor(np.array([ids], dtype=np.int64)), config)
        ttfts.append(result.perf_metrics.get_ttft().mean)
        tpots.append(result.perf_metrics.get_tpot().mean)
    return {
        "mean_ttft_ms": statistics.mean(ttfts),
        "decode_tok_s": 1000.0 / statistics.mean(tpots),
    }


def main() -> None:
    """Parse the command line, run S1 and S16, print and write the results."""
    import openvino_genai as ov_genai
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="OpenVINO IR directory (optimum-cli export)")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args()
    n = args.num_prompts
    prompts = make_prompts(
        AutoTokenizer.from_pretrained(args.tokenizer), 2 * n + 1, args.prompt_len
    )
    scheduler = ov_genai.SchedulerConfig()
    scheduler.cache_size = 2  # GB of KV cache
    scheduler.max_num_batched_tokens = 256  # split-fuse prefill budget, OpenVINO's default
    scheduler.enable_prefix_caching = False
    pipe = ov_genai.ContinuousBatchingPipeline(args.model, scheduler, "CPU")
    run(pipe, prompts[:1], 4, concurrent=False)  # warm-up; its prompt is not reused
    results = {
        "s1": run(pipe, prompts[1 : n + 1], args.new_tokens, concurrent=False),
        "s16": run(pipe, prompts[n + 1 :], args.new_tokens, concurrent=True),
        "openvino_genai": ov_genai.__version__,
    }
    del pipe
    results["s1_llm_pipeline"] = run_llm_pipeline(args.model, prompts[: n + 1], args.new_tokens)
    print(json.dumps(results, indent=2))
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
