"""Tile sizes and the torch launcher of the Triton paged-attention kernel.

:func:`paged_attention_triton` runs :func:`~llmc.plugins.paged_attention.triton_kernel.
paged_attention_kernel` on torch tensors (CUDA, or CPU under ``TRITON_INTERPRET=1``) with the
reference's signature; :func:`kernel_config` and :func:`kernel_constants` are shared with the
TensorRT AOT compile so both launch the same kernel the same way. Imports ``triton``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from llmc.plugins.paged_attention.triton_kernel import paged_attention_kernel

#: Cache element kinds, the kernel's ``CACHE_QUANT`` constant.
CACHE_QUANT = {"none": 0, "fp8": 1, "int8": 2}

_ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes of one launch (all powers of two).

    Attributes:
        group: query heads per KV head, ``H // KVH``.
        group_pad: ``group`` rounded up to a power of two.
        block_m: new tokens per program; ``block_m * group_pad`` rows (>= 16: ``tl.dot``'s
            minimum on a GPU).
        block_n: keys per softmax update (>= 16).
        block_d: head dim padded to a power of two (>= 16).
    """

    group: int
    group_pad: int
    block_m: int
    block_n: int
    block_d: int

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
) -> KernelConfig:
    """Choose tile sizes. ``block_m`` defaults to the fewest tokens that fill 16 rows.

    Raises:
        ValueError: ``num_heads`` is not a multiple of ``num_kv_heads``, or a block size is not
            a power of two, or ``block_m * group_pad`` or ``block_n`` is below 16.
    """
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    if block_m is None:
        block_m = max(1, 16 // group_pad)
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if block_m * group_pad < 16 or block_n < 16:
        raise ValueError(
            f"block_m * group_pad ({block_m} * {group_pad}) and block_n ({block_n}) must be "
            "at least 16 (tl.dot's minimum tile on a GPU)"
        )
    block_d = max(16, triton.next_power_of_2(head_dim))
    return KernelConfig(group, group_pad, block_m, block_n, block_d)


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
    float32_inputs: bool,
) -> dict[str, object]:
    """The kernel's compile-time constants, by parameter name (also the AOT ``constexprs``)."""
    return {
        "NUM_HEADS": num_heads,
        "NUM_KV_HEADS": num_kv_heads,
        "HEAD_DIM": head_dim,
        "GROUP": config.group,
        "GROUP_PAD": config.group_pad,
        "BLOCK_SIZE": block_size,
        "SCALE": float(scale),
        "SLIDING_WINDOW": int(sliding_window or 0),
        "LOGIT_SOFTCAP": float(logit_softcap or 0.0),
        "CACHE_QUANT": CACHE_QUANT[cache_quant],
        "K_SCALE": float(k_scale),
        "V_SCALE": float(v_scale),
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_D": config.block_d,
        "DOT_PRECISION": "ieee" if float32_inputs else "tf32",
    }


def cache_quant_of(cache_dtype: torch.dtype, activation_dtype: torch.dtype) -> str:
    """The ``CACHE_QUANT`` kind of a cache dtype; ValueError for one the kernel cannot hold."""
    if cache_dtype == activation_dtype:
        return "none"
    if cache_dtype == torch.float8_e4m3fn:
        return "fp8"
    if cache_dtype == torch.int8:
        return "int8"
    raise ValueError(
        f"key_cache and value_cache must be {activation_dtype} (the activations' dtype), "
        f"float8_e4m3fn or int8, got {cache_dtype}"
    )


def _check(name: str, tensor: torch.Tensor, dtypes: tuple[torch.dtype, ...], ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {dtypes}, got {tensor.dtype}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (read and written in place, never copied)")


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_tables: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    sliding_window: int | None,
    logit_softcap: float | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    block_m: int | None = None,
    block_n: int = 32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the new tokens' K/V into the paged cache in place, then attend causally (Triton).

    Same arguments and result as
    :func:`~llmc.plugins.paged_attention.reference.paged_attention_reference`, on torch tensors
    of one device (CUDA, or CPU under ``TRITON_INTERPRET=1``): q [T, H*D], k and v [T, KVH*D]
    in float32, float16 or bfloat16; caches [num_blocks, block_size, KVH, D] in q's dtype,
    ``torch.float8_e4m3fn`` or ``torch.int8``, written in place (same storage, never copied);
    seq_lens [B], query_start_loc [B+1], block_tables [B, max_blocks] int32; slot_mapping [T]
    int64. ``block_m``/``block_n``: tile sizes (see :func:`kernel_config`). ``out``: where to
    write the result ([T, H*D], q's dtype, contiguous), e.g. a TensorRT output buffer.

    Returns:
        [T, H*D] in q's dtype (``out`` when given).

    Raises:
        ValueError: a dtype, rank, shape or layout the kernel does not take, or a scale that is
            not a finite positive number. Metadata values (block ids, slots, lengths) are not
            checked on the device: the runner's step builder guarantees them.
    """
    _check("q", q, _ACTIVATION_DTYPES, 2)
    _check("k", k, (q.dtype,), 2)
    _check("v", v, (q.dtype,), 2)
    cache_quant = cache_quant_of(key_cache.dtype, q.dtype)
    _check("key_cache", key_cache, (key_cache.dtype,), 4)
    _check("value_cache", value_cache, (key_cache.dtype,), 4)
    for name, tensor, ndim in (
        ("seq_lens", seq_lens, 1),
        ("query_start_loc", query_start_loc, 1),
        ("block_tables", block_tables, 2),
    ):
        _check(name, tensor, (torch.int32,), ndim)
    _check("slot_mapping", slot_mapping, (torch.int64,), 1)
    config = kernel_config(num_heads, num_kv_heads, head_dim, block_m=block_m, block_n=block_n)
    num_tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    cache_shape = (key_cache.shape[0], key_cache.shape[1], num_kv_heads, head_dim)
    expected = {
        "q": (q, (num_tokens, num_heads * head_dim)),
        "k": (k, (num_tokens, num_kv_heads * head_dim)),
        "v": (v, (num_tokens, num_kv_heads * head_dim)),
        "key_cache": (key_cache, cache_shape),
        "value_cache": (value_cache, cache_shape),
        "query_start_loc": (query_start_loc, (num_seqs + 1,)),
        "block_tables": (block_tables, (num_seqs, block_tables.shape[1])),
        "slot_mapping": (slot_mapping, (num_tokens,)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    for name, value in (("scale", scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if not 0.0 < float(value) < float("inf"):
            raise ValueError(f"{name} must be a finite positive number, got {value}")

    if out is None:
        out = torch.empty_like(q)
    _check("out", out, (q.dtype,), 2)
    if out.shape != q.shape:
        raise ValueError(f"out must have shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if num_tokens == 0 or num_seqs == 0:
        return out
    constants = kernel_constants(
        config,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=key_cache.shape[1],
        scale=scale,
        sliding_window=sliding_window,
        logit_softcap=logit_softcap,
        cache_quant=cache_quant,
        k_scale=k_scale,
        v_scale=v_scale,
        float32_inputs=q.dtype == torch.float32,
    )
    grid = config.grid(num_tokens, num_seqs, num_kv_heads)
    if cache_quant == "fp8":  # the kernel reads and writes FP8 codes as bytes (same storage)
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    paged_attention_kernel[grid](
        q, k, v, key_cache, value_cache, seq_lens, query_start_loc, block_tables, slot_mapping,
        num_seqs, block_tables.shape[1],
        out, key_cache, value_cache,
        **constants,
    )  # fmt: skip
    return out
