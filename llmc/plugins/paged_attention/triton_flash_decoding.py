"""Flash-decoding: the attention of decode tokens split over the context, in two Triton kernels.

A decode step has one new token per sequence, so the main kernel's grid (query tiles x KV
heads) is a few dozen programs, each walking its whole context: on a GPU with 132 SMs most of
them idle. Flash-decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context
inference"; vLLM's ``paged_attention_v2`` partitions) adds a split axis over the context:

1. :func:`flash_decoding_split_kernel`, grid ``(B, KVH, S)``: program ``(b, kvh, s)`` takes
   sequence b's one new token, the query heads of KV head kvh, and the s-th of S equal slices
   of the keys that token can see (``[window start or 0, context_len)``, each slice a multiple
   of ``BLOCK_N`` keys, so a slice boundary need not fall on a cache block boundary). It runs
   the same online softmax as the main kernel (:func:`~llmc.plugins.paged_attention.
   triton_kernel.attend`) and writes a partial result: the slice's output normalized by its
   own sum, ``o_s`` [B, S, H, D], and its log-sum-exp ``lse_s = m_s + log(l_s)`` [B, S, H]
   (``-inf`` for a slice with no visible key), both float32.
2. :func:`flash_decoding_reduce_kernel`, grid ``(B, H)``: combines the S partials of one head
   with log-sum-exp rescaling, ``out = sum_s w_s o_s / sum_s w_s`` where
   ``w_s = exp(lse_s - max_s lse_s)``, and writes the token's row of ``out`` in q's dtype.

Both kernels skip sequences with other than one new token (prefill and chunked prefill stay on
the main kernel, which writes every token's K/V into the cache either way). No atomics: the
reduce is a second launch. Shapes and the split count are chosen by
:mod:`llmc.plugins.paged_attention.triton_launch`. Imports ``triton``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from llmc.plugins.paged_attention.triton_kernel import attend


@triton.jit
def flash_decoding_split_kernel(
    q_ptr,  # [T, H*D]
    k_ptr,  # [T, KVH*D]
    v_ptr,  # [T, KVH*D]
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, KVH, D], read only
    value_cache_ptr,
    seq_lens_ptr,  # [B] int32
    query_start_loc_ptr,  # [B+1] int32
    block_tables_ptr,  # [B, max_blocks] int32
    max_blocks,  # i32, block_tables' row stride
    num_splits,  # i32, S
    partial_out_ptr,  # [B, S, H, D] float32, written
    partial_lse_ptr,  # [B, S, H] float32, written
    C: tl.constexpr,  # triton_tiles.KernelConstants, the main kernel's
):
    """One program: slice ``program_id(2)`` of the context of sequence ``program_id(0)``'s
    decode token, for the GROUP query heads of KV head ``program_id(1)``. The tile has
    ``BLOCK_M * GROUP_PAD`` rows (>= 16, ``tl.dot``'s minimum) of which the first GROUP are the
    heads. Writes ``partial_out``/``partial_lse`` at ``(seq, split, head)`` (see the module
    docstring); writes nothing for a sequence with other than one new token."""
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    num_new = tl.load(query_start_loc_ptr + seq + 1) - q_start
    context_len = tl.load(seq_lens_ptr + seq)
    is_decode = num_new == 1
    pos = context_len - 1  # the decode token's position

    # This program's slice [s_lo, s_hi) of the visible keys [lo, hi).
    lo = 0
    if C.SLIDING_WINDOW > 0:
        lo = tl.maximum(pos - C.SLIDING_WINDOW + 1, 0)
    hi = tl.where(is_decode, context_len, lo)
    slice_len = tl.cdiv(tl.cdiv(hi - lo, num_splits), C.BLOCK_N) * C.BLOCK_N
    s_lo = tl.minimum(lo + split * slice_len, hi)
    s_hi = tl.minimum(s_lo + slice_len, hi)

    d = tl.arange(0, C.BLOCK_D)
    d_ok = d < C.HEAD_DIM
    kv_col = kvh * C.HEAD_DIM + d
    rows = tl.arange(0, C.BLOCK_M * C.GROUP_PAD)  # row r: query head kvh * GROUP + r
    # Scalar conditions become bounds: the interpreter cannot mask with block & scalar bools.
    row_ok = rows < tl.where(is_decode, C.GROUP, 0)
    head = kvh * C.GROUP + rows
    q_off = (
        q_start.to(tl.int64) * (C.NUM_HEADS * C.HEAD_DIM) + head[:, None] * C.HEAD_DIM + d[None, :]
    )
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    table_row = block_tables_ptr + seq.to(tl.int64) * max_blocks
    m_i, l_i, acc = attend(
        q, tl.full([C.BLOCK_M * C.GROUP_PAD], 0, tl.int32) + pos, row_ok, k_ptr, v_ptr,
        key_cache_ptr, value_cache_ptr, table_row, q_start, pos, s_lo, s_hi, kv_col, d_ok, C,
    )  # fmt: skip
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    slot = (seq * num_splits + split).to(tl.int64) * C.NUM_HEADS + head  # [ROWS]
    tl.store(partial_lse_ptr + slot, lse, mask=row_ok)
    tl.store(
        partial_out_ptr + slot[:, None] * C.HEAD_DIM + d[None, :],
        out,
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def flash_decoding_reduce_kernel(
    partial_out_ptr,  # [B, S, H, D] float32
    partial_lse_ptr,  # [B, S, H] float32
    query_start_loc_ptr,  # [B+1] int32
    num_splits,  # i32, S
    out_ptr,  # [T, H*D], the decode tokens' rows written
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program: head ``program_id(1)`` of sequence ``program_id(0)``'s decode token, its
    ``num_splits`` (<= SPLITS_PAD) partials combined by log-sum-exp rescaling."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    is_decode = tl.load(query_start_loc_ptr + seq + 1) - q_start == 1
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < tl.where(is_decode, num_splits, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    slot = (seq * num_splits + s).to(tl.int64) * NUM_HEADS + head  # [SPLITS_PAD]
    lse = tl.load(partial_lse_ptr + slot, mask=s_ok, other=float("-inf"))
    # The decode token sees itself, so some slice has a finite lse; the guard keeps the
    # skipped (non-decode) programs free of NaN.
    lse_max = tl.max(lse, 0)
    weight = tl.exp(lse - tl.where(lse_max == float("-inf"), 0.0, lse_max))  # 0 for empty
    partial = tl.load(
        partial_out_ptr + slot[:, None] * HEAD_DIM + d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * partial, 0) / tl.where(total > 0.0, total, 1.0)
    out_off = q_start.to(tl.int64) * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + d
    tl.store(
        out_ptr + out_off,
        out.to(out_ptr.dtype.element_ty),
        mask=d < tl.where(is_decode, HEAD_DIM, 0),
    )
