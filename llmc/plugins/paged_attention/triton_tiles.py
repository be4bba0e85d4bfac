"""Tile sizes, compile-time constants, shared memory and the flash-decoding split count of the
Triton paged-attention kernels: pure functions of shapes, shared by the torch launcher
(:mod:`~llmc.plugins.paged_attention.triton_launch`), the TensorRT AOT compile (trt_aot.py) and
the TensorRT lint, so that each sees the kernel the same way. Imports neither triton nor a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

#: Cache element kinds, the kernel's ``CACHE_QUANT`` constant.
CACHE_QUANT = {"none": 0, "fp8": 1, "int8": 2}


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes of one launch (all powers of two) and its Triton launch options.

    Attributes:
        group: query heads per KV head, ``H // KVH``.
        group_pad: ``group`` rounded up to a power of two.
        block_m: new tokens per program; ``block_m * group_pad`` rows (>= 16: ``tl.dot``'s
            minimum on a GPU).
        block_n: keys per softmax update (>= 16).
        block_d: head dim padded to a power of two (>= 16).
        num_warps: warps per program (Triton's ``num_warps``).
        num_stages: Triton's software-pipelining depth of the key loop (``num_stages``). 1
            (the default, and the TensorRT AOT kernels') keeps one K and one V tile in shared
            memory (:func:`shared_memory_bytes`); the torch launcher pipelines 16-bit
            activations 3 deep (``triton_launch.PIPELINED_STAGES``).
    """

    group: int
    group_pad: int
    block_m: int
    block_n: int
    block_d: int
    num_warps: int = 4
    num_stages: int = 1

    @property
    def rows(self) -> int:
        """Query rows of a program's tile: ``block_m * group_pad``."""
        return self.block_m * self.group_pad

    def grid(self, num_tokens: int, num_seqs: int, num_kv_heads: int) -> tuple[int, int]:
        """The launch grid: ``(num_tokens // block_m + num_seqs, num_kv_heads)``."""
        return (num_tokens // self.block_m + num_seqs, num_kv_heads)


def kernel_config(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    block_m: int | None = None,
    block_n: int = 32,
    num_warps: int = 4,
    num_stages: int = 1,
) -> KernelConfig:
    """Choose tile sizes. ``block_m`` defaults to the fewest tokens that fill 16 rows;
    ``num_warps`` and ``num_stages`` are Triton's launch options (see :class:`KernelConfig`).

    Raises:
        ValueError: ``num_heads`` is not a multiple of ``num_kv_heads``, or a block size or
            ``num_warps`` is not a power of two, or ``block_m * group_pad`` or ``block_n`` is
            below 16, or ``num_stages`` is below 1.
    """
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    group_pad = _next_power_of_2(group)
    if block_m is None:
        block_m = max(1, 16 // group_pad)
    for name, value in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if block_m * group_pad < 16 or block_n < 16:
        raise ValueError(
            f"block_m * group_pad ({block_m} * {group_pad}) and block_n ({block_n}) must be "
            "at least 16 (tl.dot's minimum tile on a GPU)"
        )
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    block_d = max(16, _next_power_of_2(head_dim))
    return KernelConfig(group, group_pad, block_m, block_n, block_d, num_warps, num_stages)


#: Bytes per dot operand element, by activation dtype (the dots take q's dtype).
_OPERAND_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def shared_memory_bytes(head_dim: int, dtype: torch.dtype | str, config: KernelConfig) -> int:
    """Shared memory one program of the paged-attention kernels needs, in bytes (pure).

    ``e * (rows * block_d + block_n * block_d + rows * block_n)``, plus 64 for float32, where
    ``e`` is the activations' element size (2 for float16/bfloat16, 4 for float32: the dots'
    operands are in that dtype, whatever the cache holds) and ``rows = block_m * group_pad``.
    The terms: the Q tile [rows, block_d], held for the whole key loop as the first dot's
    operand; one key-or-value tile [block_n, block_d] (K^T for ``Q K^T``, then V for ``P V``:
    Triton reuses the buffer); P [rows, block_n] for the second dot. The 64 bytes are padding
    Triton's float32 (FMA) dot adds to some tiles. The flash-decoding split kernel runs the same
    loop on the same tiles (same count); its reduce kernel needs at most 8 bytes.

    Source: Triton 3.9's ``metadata.shared`` of these kernels compiled for sm80 and sm90
    (``triton.compile``, no GPU needed), measured over head dims 64/128/256, ``block_n``
    16/32/64, groups 1/4/8/32, all three dtypes and fp8/int8 caches: equal to this formula for
    16-bit inputs, equal or 64 bytes below it for float32; the same with ``num_stages`` 1 or 3
    and 4 or 8 warps (the gathered K/V loads are not software-pipelined). Examples with the
    default tiles (``block_n`` 32): Gemma 3 (head dim 256, 4 heads on 1 KV head) 25,600 in
    bfloat16 (within the 48 KB a launch gets without opting in) and 51,264 in float32 (above
    it: needs the opt-in, or ``block_n`` 16: 33,856); Llama-3-8B (head dim 128, GQA 4) 13,312
    in bfloat16. The test ``test_shared_memory_bytes_bounds_what_triton_allocates`` compiles
    the kernels and checks this bound.

    Raises:
        ValueError: a dtype other than float32/float16/bfloat16, or a ``head_dim`` that is not
            the one ``config`` was made for.
    """
    name = str(dtype).removeprefix("torch.")
    if name not in _OPERAND_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(_OPERAND_BYTES)}, got {dtype}")
    if config.block_d != max(16, _next_power_of_2(head_dim)):
        raise ValueError(f"head_dim {head_dim} does not fit config.block_d {config.block_d}")
    size = _OPERAND_BYTES[name]
    tiles = config.rows * config.block_d + config.block_n * config.block_d
    tiles += config.rows * config.block_n
    return size * tiles + (64 if size == 4 else 0)


#: Flash-decoding: fewest keys per split the heuristic allows, and the most splits (the reduce
#: kernel's padded split axis).
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 64
#: Programs per streaming multiprocessor a decode step should launch (see ``choose_num_splits``).
TARGET_WAVES = 4


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int) -> int:
    """How many slices to split each decode token's context into (flash-decoding).

    Without a split, decode runs ``num_seqs * num_kv_heads`` programs, each reading its
    sequence's whole context for one KV head. The split count is the smallest power of two
    that launches at least ``TARGET_WAVES`` programs per SM (``num_sms`` streaming
    multiprocessors), bounded by the largest power of two that keeps each slice at least
    ``MIN_KEYS_PER_SPLIT`` keys long and by ``MAX_SPLITS``.

    Why: a decode step is bound by the KV cache bytes it reads, and one program per SM
    does not keep enough loads in flight to reach the memory's bandwidth. Measured on an H100
    (132 SMs; ``benchmarks/bench_triton_splits.py``, bf16, RESULTS.md "Paged-attention
    kernels"): Llama-3-8B at batch 16 and 32768 keys (128 programs, about one wave) takes
    3.61 ms unsplit and 1.01 ms at 4 or 8 splits; more splits past about 4 waves gain nothing
    (batch 64, 512 programs: 4.34 ms unsplit, 3.98 at 2, 3.94 at 16). Powers of two keep the
    slices on the cache's block boundaries (14 splits of 4096 keys took 0.117 ms where 16 took
    0.065). FlashAttention's ``num_splits_heuristic`` (Dao-AILab/flash-attention,
    ``csrc/flash_attn/flash_api.cpp``) stops splitting at 80% of one wave; this kernel,
    measured, wants four. Examples on 132 SMs: Llama-3-8B (8 KV heads) batch 1 at 32768 keys
    -> 64; batch 16 -> 8; batch 64 at 4096 -> 2; Gemma 3 (1 KV head) batch 64 at 4096 -> 16
    (256-key slices).

    ``max_context_len`` is a bound taken from shapes (``block_tables.shape[1] * block_size``),
    so choosing needs no device-to-host copy; prefill sequences count among ``num_seqs``.
    """
    programs = num_seqs * num_kv_heads
    most = max(1, min(MAX_SPLITS, max_context_len // MIN_KEYS_PER_SPLIT))
    splits = 1
    while programs * splits < TARGET_WAVES * num_sms and splits * 2 <= most:
        splits *= 2
    return splits


#: Query rows (new tokens x padded group) per program of a prefill-heavy step.
PREFILL_ROWS = 64


def choose_block_m(num_tokens: int, num_seqs: int, group_pad: int) -> int | None:
    """New tokens per program for a step of ``num_tokens`` new tokens over ``num_seqs``
    sequences: ``PREFILL_ROWS // group_pad`` when the step averages at least that many new
    tokens per sequence (prefill-heavy), else None (`kernel_config`'s default: 16 rows, the
    least a decode token wastes).

    Source: measured on an H100 (Triton 3.6, bf16, ``benchmarks/bench_triton_tiles.py``):
    64 rows against the default 16 ran a 4096-token prefill 2.5x faster on Llama-3-8B's
    shape (1.12 against 2.75 ms) and 1.6x on Gemma 3's (0.68 against 1.08 ms), a 512-token
    chunk over 4096 keys 1.8x faster on Llama's; 128 and 256 rows were slower, and decode of 64
    sequences at 32768 keys ran 1.8x slower at 64 rows (7.97 against 4.38 ms).
    """
    block_m = max(1, PREFILL_ROWS // group_pad)
    return block_m if num_tokens >= block_m * num_seqs else None


class KernelConstants(NamedTuple):
    """The compile-time constants of the paged-attention kernel and the flash-decoding split
    kernel: one ``tl.constexpr`` argument ``C`` of both (read as ``C.HEAD_DIM``), so a kernel
    JIT-compiles once per distinct value and TensorRT's AOT launch passes none of them. Made by
    :func:`kernel_constants`; the names are the kernels' (upper case, as constants)."""

    NUM_HEADS: int  # H
    NUM_KV_HEADS: int  # KVH
    HEAD_DIM: int  # D
    GROUP: int  # query heads per KV head (KernelConfig.group)
    GROUP_PAD: int  # GROUP rounded up to a power of two
    BLOCK_SIZE: int  # tokens per cache block
    SCALE: float  # softmax scale applied to q.k
    SLIDING_WINDOW: int  # window in tokens including self; 0 = none
    LOGIT_SOFTCAP: float  # c in c*tanh(s/c); 0 = none
    CACHE_QUANT: int  # the cache's codes, a value of CACHE_QUANT (0 = the activations' dtype)
    K_SCALE: float  # key = code * K_SCALE (quantized cache)
    V_SCALE: float  # value = code * V_SCALE (quantized cache)
    BLOCK_M: int  # new tokens per program (KernelConfig.block_m)
    BLOCK_N: int  # keys per softmax update
    BLOCK_D: int  # D padded to a power of two
    UPCAST_DOT: bool  # widen bfloat16 dot operands to float32 (the interpreter's defect)


def kernel_constants(
    config: KernelConfig,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    scale: float,
    sliding_window: int | None,
    logit_softcap: float | None,
    cache_quant: str,
    k_scale: float,
    v_scale: float,
    upcast_dot: bool = False,
) -> KernelConstants:
    """The kernels' :class:`KernelConstants` for one layer and ``config``'s tiles (the launcher
    passes it as ``C``, the AOT compile in its ``constexprs``); None for ``sliding_window`` or
    ``logit_softcap`` becomes 0. ``cache_quant``: a key of :data:`CACHE_QUANT`. ``upcast_dot``:
    only under the interpreter, see triton_kernel.py."""
    return KernelConstants(
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        GROUP=config.group,
        GROUP_PAD=config.group_pad,
        BLOCK_SIZE=block_size,
        SCALE=float(scale),
        SLIDING_WINDOW=int(sliding_window or 0),
        LOGIT_SOFTCAP=float(logit_softcap or 0.0),
        CACHE_QUANT=CACHE_QUANT[cache_quant],
        K_SCALE=float(k_scale),
        V_SCALE=float(v_scale),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_D=config.block_d,
        UPCAST_DOT=upcast_dot,
    )
