"""The steps an execution-provider candidate is timed on, and the timing of one runner.

Three steps stand for serving (DESIGN §9's table): one decode at batch 1, one decode at batch 16
and one 128-token prefill, each clamped to the engine's limits. They share one KV pool and are
idempotent: a rerun writes the same keys and values at the same slots, so every run of a step
returns the same logits and the first run (the warmup) is the one compared across providers.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from llmc.runtime.runners.step_inputs import StepInputs, single_prefill

PREFILL_TOKENS = 128
DECODE_BATCH = 16
REPEATS = 3  # timed runs per step after the warmup; the median is kept


@dataclass(frozen=True)
class ProbeSteps:
    """The timed steps of one engine and the KV pool they need (``num_blocks``)."""

    steps: dict[str, StepInputs]  # "prefill_128", "decode_1", "decode_16" (sizes as clamped)
    num_blocks: int


def probe_steps(
    block_size: int,
    vocab_size: int,
    max_seq_len: int,
    max_num_tokens: int,
    max_batch: int,
    seed: int = 0,
) -> ProbeSteps:
    """A prefill of P tokens for sequence 0, then decodes at position P of 1 and of B sequences.

    P = min(128, max_num_tokens, max_seq_len - 1), B = min(16, max_batch, max_num_tokens).
    Sequence 0 owns blocks 0..nb-1 (nb = ceil((P + 1) / block_size)); decode sequence i >= 1
    shares its full prefix blocks and writes position P into a private block ``nb + i - 1`` (its
    positions past the shared prefix, if any, were never written: zeros, the same for every
    provider). Token ids are drawn from ``seed``, avoiding ids 0-2 (bos/eos/pad in most vocabs).
    """
    p = max(1, min(PREFILL_TOKENS, max_num_tokens, max_seq_len - 1))
    b = max(1, min(DECODE_BATCH, max_batch, max_num_tokens))
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, vocab_size, size=p, dtype=np.int64)
    token = int(rng.integers(3, vocab_size))
    nb = -(-(p + 1) // block_size)
    full = p // block_size
    prefill = single_prefill(prompt, block_size, all_logits=False)
    tables = np.zeros((b, nb), np.int32)
    tables[0] = np.arange(nb)
    slots = np.full(b, p, np.int64)
    for i in range(1, b):
        tables[i, :full] = np.arange(full)
        tables[i, full] = nb + i - 1
        slots[i] = (nb + i - 1) * block_size + p % block_size
    steps = {f"prefill_{p}": prefill, "decode_1": _decode(token, p, tables[:1], slots[:1])}
    if b > 1:
        steps[f"decode_{b}"] = _decode(token, p, tables, slots)
    return ProbeSteps(steps, num_blocks=nb + b - 1)


def _decode(token: int, position: int, tables: np.ndarray, slots: np.ndarray) -> StepInputs:
    b = int(tables.shape[0])
    return StepInputs(
        input_ids=np.full(b, token, np.int64),
        positions=np.full(b, position, np.int64),
        seq_lens=np.full(b, position + 1, np.int32),
        query_start_loc=np.arange(b + 1, dtype=np.int32),
        block_tables=np.ascontiguousarray(tables),
        slot_mapping=np.ascontiguousarray(slots),
        logits_indices=np.arange(b, dtype=np.int64),
    )


def time_steps(
    runner, probe: ProbeSteps, repeats: int = REPEATS
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Run each step of ``probe`` once (warmup) and ``repeats`` more times on ``runner`` (a
    ``Runner``: ``execute(StepInputs) -> logits``), in the order of ``probe.steps``.

    Returns the warmup's logits per step ([R, vocab] float32) and the median wall time per step
    in milliseconds (empty with ``repeats=0``). Raises whatever the runner raises.
    """
    logits: dict[str, np.ndarray] = {}
    median_ms: dict[str, float] = {}
    for name, step in probe.steps.items():
        logits[name] = np.array(runner.execute(step), dtype=np.float32)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            runner.execute(step)
            times.append((time.perf_counter() - start) * 1e3)
        if times:
            median_ms[name] = statistics.median(times)
    return logits, median_ms


def max_relative_diff(logits: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """max over steps of max|logits - reference| / max|reference|: the logits' error relative
    to their scale (DESIGN §9 measures the OpenVINO EP's this way). NaN anywhere gives inf."""
    worst = 0.0
    for name, ref in reference.items():
        diff = np.abs(logits[name].astype(np.float64) - ref)
        scale = max(float(np.abs(ref).max()), 1e-30)
        value = float(diff.max()) / scale
        worst = max(worst, value if np.isfinite(value) else float("inf"))
    return worst
