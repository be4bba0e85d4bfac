"""What an engine is served with when the caller does not say: per target, chosen by
measurement (``benchmarks/bench_token_budget.py``)."""

from __future__ import annotations

from llmc.engine.manifest import EngineManifest

#: Default step token budget of a cpu engine (chunked prefill beyond it) and its prefill-first
#: bound (``SchedulerConfig.max_decode_wait_steps``), chosen together with
#: ``benchmarks/bench_token_budget.py``: Gemma 3 270M int8, 16 simultaneous 128-token prompts,
#: 128 tokens each, three interleaved rounds (Intel Xeon, 2 cores, AVX-512 VNNI): mean TTFT
#: 697 ms at 512 tokens with decodes first, 575 ms at 384 tokens prefill first, output 294
#: and 289 tok/s (medians; benchmarks/RESULTS.md, "Step token budget against TTFT under load").
CPU_STEP_TOKENS = 384
CPU_DECODE_WAIT_STEPS = 8


def default_step_tokens(manifest: EngineManifest) -> int:
    """The step token budget an engine is served with by default: its ``max_num_tokens``,
    capped at ``CPU_STEP_TOKENS`` for a cpu engine."""
    if manifest.target == "cpu":
        return min(manifest.max_num_tokens, CPU_STEP_TOKENS)
    return manifest.max_num_tokens


def default_decode_wait(manifest: EngineManifest) -> int:
    """The prefill-first bound an engine is served with by default: ``CPU_DECODE_WAIT_STEPS``
    for a cpu engine, 0 (decodes first, unmeasured on GPUs) otherwise."""
    return CPU_DECODE_WAIT_STEPS if manifest.target == "cpu" else 0
