"""The attention layers and steps ``ci/gpu_acceptance.py`` runs: real shapes (Llama-3-8B,
Gemma 3 270M's local and global layers) and workloads (prefill, chunked prefill, a mixed step,
decode at batch 1/16/64), tiny ones for the interpreter's dry run, and a step's random inputs in
the reference's argument order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """One attention layer's shape (DESIGN §3 attributes)."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    logit_softcap: float | None = None


@dataclass(frozen=True)
class Workload:
    """One step: per sequence (context length after the step, new tokens)."""

    name: str
    seqs: tuple[tuple[int, int], ...]


REAL_SHAPES = (
    Shape("llama-3-8b", 32, 8, 128),
    Shape("gemma-3-270m-local", 4, 1, 256, sliding_window=512),
    Shape("gemma-3-270m-global", 4, 1, 256),
)
TINY_SHAPES = (
    Shape("tiny-gqa4", 8, 2, 32),
    Shape("tiny-mqa-window", 4, 1, 32, sliding_window=24),
)


def real_workloads(max_context: int) -> list[Workload]:
    """The prefill, mixed and decode workloads (batch 1/16/64) up to ``max_context`` tokens."""
    workloads = [
        Workload("prefill 1x512", ((512, 512),)),
        Workload("prefill 1x4096", ((4096, 4096),)),
        Workload("prefill 4x1024", ((1024, 1024),) * 4),
        Workload("chunk 512 of 4096", ((4096, 512),)),
        Workload("mixed 15x4096 dec+512", ((4096, 1),) * 15 + ((512, 512),)),
    ]
    for batch in (1, 16, 64):
        for context in (512, 4096, 32768):
            if context <= max_context:
                workloads.append(Workload(f"decode {batch}x{context}", ((context, 1),) * batch))
    return [w for w in workloads if max(c for c, _ in w.seqs) <= max_context]


TINY_WORKLOADS = (
    Workload("prefill 1x40", ((40, 40),)),
    Workload("chunk 16 of 48", ((48, 16),)),
    Workload("mixed", ((70, 1), (30, 1), (20, 20))),
    Workload("decode 2x60", ((60, 1),) * 2),
)


def make_step(shape: Shape, workload: Workload, dtype, device, block_size: int, seed: int):
    """Random inputs of one step, in the reference's argument order: q, k, v, key_cache,
    value_cache, seq_lens, query_start_loc, block_tables, slot_mapping. Blocks are shuffled."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks = [-(-context // block_size) for context, _ in workload.seqs]
    num_blocks = sum(blocks) + 2
    ids = torch.randperm(num_blocks, generator=gen)[: sum(blocks)].to(torch.int32)
    block_tables = torch.zeros((len(blocks), max(blocks)), dtype=torch.int32)
    slots, start = [], 0
    for b, ((context, num_new), n) in enumerate(zip(workload.seqs, blocks, strict=True)):
        block_tables[b, :n] = ids[start : start + n]
        start += n
        slots += [int(block_tables[b, p // block_size]) * block_size + p % block_size
                  for p in range(context - num_new, context)]  # fmt: skip
    num_tokens = len(slots)
    kv_width = shape.num_kv_heads * shape.head_dim

    # Random values made on the device: the caches of the largest cases are gigabytes.
    device_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int, scale: float = 1.0):
        return torch.randn(size, generator=device_gen, device=device, dtype=dtype).mul_(scale)

    cache_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    return [
        randn(num_tokens, shape.num_heads * shape.head_dim, scale=2.0),
        randn(num_tokens, kv_width),
        randn(num_tokens, kv_width),
        randn(*cache_shape),
        randn(*cache_shape),
        torch.tensor([c for c, _ in workload.seqs], dtype=torch.int32, device=device),
        torch.tensor(
            [0] + [sum(n for _, n in workload.seqs[: i + 1]) for i in range(len(workload.seqs))],
            dtype=torch.int32,
            device=device,
        ),  # fmt: skip
        block_tables.to(device),
        torch.tensor(slots, dtype=torch.int64, device=device),
    ]


def step_bytes(shape: Shape, workload: Workload, block_size: int, itemsize: int) -> int:
    """A bound on the memory one case needs: the caches three times (the kernel's, the
    reference's copy, SDPA's dense gather) and the reference's float32 scores and keys."""
    tokens = sum(-(-c // block_size) * block_size for c, _ in workload.seqs)
    caches = 2 * tokens * shape.num_kv_heads * shape.head_dim * itemsize
    longest = max(c for c, _ in workload.seqs)
    widest = max(n for _, n in workload.seqs)
    reference = 4 * shape.num_heads * (3 * widest * longest + 2 * longest * shape.head_dim)
    return 3 * caches + reference


def kwargs_of(shape: Shape) -> dict:
    """The plugin attributes of ``shape`` as kernel keyword arguments."""
    return dict(num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                head_dim=shape.head_dim, scale=shape.head_dim**-0.5,
                sliding_window=shape.sliding_window, logit_softcap=shape.logit_softcap)  # fmt: skip
