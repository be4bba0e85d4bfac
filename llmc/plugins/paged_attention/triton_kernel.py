"""The Triton kernel of ``llmc::PagedAttention`` (GPU; on CPU through ``TRITON_INTERPRET=1``).

Same contract as :func:`llmc.plugins.paged_attention.reference.paged_attention_reference`
(DESIGN §3): packed ragged tokens mixing prefill and decode, block tables, slot mapping with the
KV cache written in place, GQA/MQA, sliding window, logit soft-cap, and an optional quantized
cache (FP8 E4M3FN or int8, per-layer ``k_scale``/``v_scale``).

Algorithm: the tiled online softmax of FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster
Attention with Better Parallelism and Work Partitioning"): per query row a running max ``m``,
a running sum ``l`` and an unnormalized accumulator, rescaled by ``exp(m_old - m_new)`` per key
tile, divided by ``l`` once at the end. Keys are read through the block table as in vLLM's
PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention"); the mapping of query tiles to sequences of a packed batch follows vLLM's
``triton_unified_attention`` (a binary search over ``query_start_loc``).

Grid and tiling:

- Grid ``(num_tokens // BLOCK_M + num_seqs, num_kv_heads)``. Sequence b owns the query tiles
  ``query_start_loc[b] // BLOCK_M + b`` onwards, one per ``BLOCK_M`` of its new tokens; a
  program finds its sequence by binary search. Programs past a sequence's last tile do nothing.
  (That bound holds for any split of tokens into sequences, so the grid depends on shapes only,
  which TensorRT's AOT launch needs.)
- A program takes one KV head and ``BLOCK_M`` new tokens of one sequence: its rows are those
  tokens times the ``GROUP = H / KVH`` query heads that share the KV head (padded to a power of
  two, ``GROUP_PAD``), so each K/V tile is loaded once for the whole group. It walks the
  context ``BLOCK_N`` keys at a time, from the window's start (or 0) to its last token's
  position: ``S = Q K^T`` ([ROWS, BLOCK_N], float32 accumulate), scale, soft-cap, causal and
  window masks, online softmax update, ``acc += P V``. Head dims are padded to ``BLOCK_D``.
- One kernel does the cache write too (TensorRT's AOT plugin launches exactly one kernel): each
  program writes its own tokens' K/V rows of its KV head to their slots; keys of this step's
  tokens are read from the ``k``/``v`` inputs (through the same quantize-dequantize the cache
  applies), older keys from the cache. No program reads a slot another program writes, so no
  grid-wide barrier is needed — as long as this step's slots are not in the old context
  (true of any slot mapping a block pool produces).

Dtypes: q/k/v float32, float16 or bfloat16. Both dots take operands in q's dtype with float32
accumulation: 16-bit inputs stay on the tensor cores (no upcast, no TF32), float32 inputs are
multiplied in IEEE float32. A quantized cache enters the dot as its codes, not as dequantized
values: FP8 E4M3 values and int8 integers are exact in float16 and bfloat16, and the scale
multiplies the float32 result (``q . (c * s) = (q . c) * s``). P is rounded to q's dtype for
``P V`` (as in FlashAttention); the softmax (max, exp, sum) is float32, and the output is
rounded to q's dtype once. The interpreter of Triton 3.9 multiplies bfloat16 operands as their
integer bit patterns (``create_dot`` on numpy uint16), so under ``TRITON_INTERPRET=1`` the
launcher sets ``UPCAST_DOT`` and bfloat16 operands are widened to float32 just for the product
(exact, so the same numbers up to the summation order).

Decode tokens of long contexts can instead go to the flash-decoding kernels in
:mod:`llmc.plugins.paged_attention.triton_flash_decoding` (``SPLIT_DECODE``): this kernel then
still writes their K/V into the cache, and leaves their attention to those kernels.

The cache: q's dtype, int8 or FP8 E4M3FN, the FP8 one passed as its uint8 view; its codes are
made and read exactly as reference.py's (:mod:`~llmc.plugins.paged_attention.triton_cache_codes`).
Layer constants (heads, scale, window, soft-cap, KV scales) and tile sizes are compile-time
constants, one ``tl.constexpr`` argument ``C``
(:class:`~llmc.plugins.paged_attention.triton_tiles.KernelConstants`, shared with the
flash-decoding split kernel and :func:`attend`): TensorRT's AOT launch passes only int32
scalars, and a JIT run compiles one kernel per distinct set (a few per model).

Tile sizes are in :mod:`llmc.plugins.paged_attention.triton_tiles`, the torch launcher in
:mod:`llmc.plugins.paged_attention.triton_launch`; the TensorRT plugin
(:mod:`llmc.plugins.paged_attention.trt_plugin`) compiles this same kernel ahead of time. Import
this module only where Triton is used: it imports ``triton`` (and raises
:class:`~llmc.errors.LlmcError` when it is missing). For the CPU interpreter set
``TRITON_INTERPRET=1`` before this module is first imported (``@triton.jit`` reads it).
"""

from __future__ import annotations

from llmc.engine.plugin import INPUTS
from llmc.errors import LlmcError

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised only where triton is absent
    raise LlmcError(
        "the Triton paged-attention kernel needs triton: pip install triton==3.9.0 "
        "(or pip install -e '.[dev]')"
    ) from error

from llmc.plugins.paged_attention.triton_cache_codes import (  # noqa: E402 (after the check)
    fp8_value,
    quantize,
    store_codes,
)

#: Kernel parameters in order: input pointers, the int32 scalars, output pointers (the order
#: TensorRT's AOT launch passes them), then the compile-time constants ``C`` and
#: ``SPLIT_DECODE``.
POINTER_INPUTS = tuple(f"{name}_ptr" for name in INPUTS)
SCALAR_INPUTS = ("num_seqs", "max_blocks")
POINTER_OUTPUTS = ("out_ptr", "key_cache_out_ptr", "value_cache_out_ptr")


@triton.jit
def _tanh(x):
    # 2 / (1 + e^-2x) - 1: saturates to +-1 without overflow (tl has no portable tanh).
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _dot(a, b, UPCAST_DOT: tl.constexpr):
    """``a @ b`` with float32 accumulation, operands in their own dtype (tensor cores for 16-bit
    ones, IEEE for float32); ``UPCAST_DOT`` widens them first (the interpreter's bf16 defect)."""
    if UPCAST_DOT:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)


@triton.jit
def _load_operand(cache_ptr, input_ptr, cache_off, input_off, old, new, d_ok, scale,
                  CACHE_QUANT: tl.constexpr, DTYPE: tl.constexpr):  # fmt: skip
    """One tile of keys (or values) as cache codes in ``DTYPE``: rows cached before this step
    from ``cache_ptr``, this step's rows from ``input_ptr`` through the cache's quantization.
    Codes are exact in ``DTYPE`` (see the module docstring); the caller applies ``scale``."""
    cached = tl.load(cache_ptr + cache_off, mask=old[:, None] & d_ok[None, :], other=0)
    fresh = tl.load(input_ptr + input_off, mask=new[:, None] & d_ok[None, :], other=0.0)
    if CACHE_QUANT == 0:
        codes = tl.where(new[:, None], fresh, cached)
    else:
        old_codes = cached.to(tl.float32)
        if CACHE_QUANT == 1:
            old_codes = fp8_value(cached.to(tl.int32))
        new_codes = quantize(fresh.to(tl.float32), scale, CACHE_QUANT)
        codes = tl.where(new[:, None], new_codes, old_codes)
    return codes.to(DTYPE)


@triton.jit
def attend(
    q,  # [ROWS, BLOCK_D] in the inputs' dtype
    pos,  # [ROWS] int32, each row's position in its sequence
    row_ok,  # [ROWS] bool
    k_ptr, v_ptr, key_cache_ptr, value_cache_ptr,
    table_row,  # the sequence's row of block_tables
    q_start, first_new,  # the sequence's first new token: index in the step, position
    kv_lo, kv_hi,  # the keys [kv_lo, kv_hi) to visit
    kv_col,  # [BLOCK_D] this KV head's columns in a [*, KVH*D] row
    d_ok,  # [BLOCK_D] bool, d < HEAD_DIM
    C: tl.constexpr,  # triton_tiles.KernelConstants
):  # fmt: skip
    """The online softmax of ``q`` over keys ``[kv_lo, kv_hi)`` of one sequence and KV head
    (FlashAttention-2, Dao 2023), masked causally (key j visible to a row at position p when
    ``j <= p``), by the window and by ``row_ok``. Returns ``(m, l, acc)``: per row the running
    max [ROWS], the sum of ``exp(score - m)`` [ROWS] and the unnormalized ``sum p * v``
    [ROWS, BLOCK_D], all float32, where ``ROWS = C.BLOCK_M * C.GROUP_PAD``; a row that saw
    nothing has ``m = -inf, l = 0, acc = 0``."""
    kv_row = C.NUM_KV_HEADS * C.HEAD_DIM
    m_i = tl.full([C.BLOCK_M * C.GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([C.BLOCK_M * C.GROUP_PAD], tl.float32)
    # tl.constexpr(...): Triton 3.6 reads a field of a constexpr tuple as a plain int, which a
    # 2-D shape list refuses ("'int' object has no attribute 'type'"); 3.9 takes either.
    acc = tl.zeros([C.BLOCK_M * C.GROUP_PAD, tl.constexpr(C.BLOCK_D)], tl.float32)
    for j0 in range(kv_lo, kv_hi, C.BLOCK_N):
        j = j0 + tl.arange(0, C.BLOCK_N)
        in_range = j < kv_hi
        old = in_range & (j < first_new)  # in the cache before this step
        new = in_range & (j >= first_new)  # this step's tokens: from k/v
        block = tl.load(table_row + j // C.BLOCK_SIZE, mask=old, other=0).to(tl.int64)
        cache_off = (block * C.BLOCK_SIZE + j % C.BLOCK_SIZE)[:, None] * kv_row + kv_col[None, :]
        input_off = (q_start + j - first_new).to(tl.int64)[:, None] * kv_row + kv_col[None, :]

        keys = _load_operand(key_cache_ptr, k_ptr, cache_off, input_off, old, new, d_ok,
                             C.K_SCALE, C.CACHE_QUANT, q.dtype)  # fmt: skip
        scores = _dot(q, tl.trans(keys), C.UPCAST_DOT)  # [ROWS, BLOCK_N]
        if C.CACHE_QUANT != 0:
            scores = scores * C.K_SCALE
        scores = scores * C.SCALE
        if C.LOGIT_SOFTCAP > 0:
            scores = C.LOGIT_SOFTCAP * _tanh(scores / C.LOGIT_SOFTCAP)
        visible = row_ok[:, None] & in_range[None, :] & (j[None, :] <= pos[:, None])
        if C.SLIDING_WINDOW > 0:
            visible = visible & (j[None, :] > pos[:, None] - C.SLIDING_WINDOW)
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row with nothing visible yet keeps m = -inf; exp(-inf - 0) = 0 keeps it empty.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        values = _load_operand(value_cache_ptr, v_ptr, cache_off, input_off, old, new, d_ok,
                               C.V_SCALE, C.CACHE_QUANT, q.dtype)  # fmt: skip
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), values, C.UPCAST_DOT)
        m_i = m_new
    if C.CACHE_QUANT != 0:
        acc = acc * C.V_SCALE
    return m_i, l_i, acc


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, pid, C: tl.constexpr):
    """The sequence of query tile ``pid``: the last b with
    ``query_start_loc[b] // BLOCK_M + b <= pid`` (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // C.BLOCK_M + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _write_cache(k_ptr, v_ptr, slot_mapping_ptr, key_cache_out_ptr, value_cache_out_ptr,
                 q_start, tok0, num_new, kv_col, d_ok, C: tl.constexpr):  # fmt: skip
    """Write one KV head of new tokens ``tok0 .. tok0 + BLOCK_M`` (those below ``num_new``) of
    the sequence starting at ``q_start`` into the cache at their slots (quantized)."""
    kv_row = C.NUM_KV_HEADS * C.HEAD_DIM
    wt = tok0 + tl.arange(0, C.BLOCK_M)
    w_mask = (wt < num_new)[:, None] & d_ok[None, :]
    w_tok = (q_start + wt).to(tl.int64)
    slots = tl.load(slot_mapping_ptr + w_tok, mask=wt < num_new, other=0).to(tl.int64)
    src = w_tok[:, None] * kv_row + kv_col[None, :]
    dst = slots[:, None] * kv_row + kv_col[None, :]
    new_k = quantize(tl.load(k_ptr + src, mask=w_mask).to(tl.float32), C.K_SCALE, C.CACHE_QUANT)
    new_v = quantize(tl.load(v_ptr + src, mask=w_mask).to(tl.float32), C.V_SCALE, C.CACHE_QUANT)
    store_codes(key_cache_out_ptr, dst, new_k, w_mask, C.CACHE_QUANT)
    store_codes(value_cache_out_ptr, dst, new_v, w_mask, C.CACHE_QUANT)


@triton.jit
def paged_attention_kernel(
    q_ptr,  # [T, H*D]
    k_ptr,  # [T, KVH*D]
    v_ptr,  # [T, KVH*D]
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, KVH, D], read
    value_cache_ptr,
    seq_lens_ptr,  # [B] int32
    query_start_loc_ptr,  # [B+1] int32
    block_tables_ptr,  # [B, max_blocks] int32
    slot_mapping_ptr,  # [T] int64
    num_seqs,  # i32, B
    max_blocks,  # i32, block_tables' row stride
    out_ptr,  # [T, H*D]
    key_cache_out_ptr,  # the key cache again (aliased output): written
    value_cache_out_ptr,
    C: tl.constexpr,  # triton_tiles.KernelConstants
    SPLIT_DECODE: tl.constexpr,
):
    """One program: BLOCK_M query tokens of one sequence x the GROUP query heads of KV head
    ``program_id(1)``; grid (T // BLOCK_M + B, KVH), launched by ``triton_launch``. Writes the
    tile's new K/V rows into the cache at ``slot_mapping`` (quantized per CACHE_QUANT with
    K_SCALE/V_SCALE) and out [T, H*D] = softmax(soft-capped, windowed, causal QK^T * SCALE) V,
    computed with FlashAttention-2's online softmax (Dao 2023) over BLOCK_N keys at a time read
    through the block table (vLLM's PagedAttention, Kwon et al. 2023). With SPLIT_DECODE, the
    attention of a sequence with one new token is left to the flash-decoding kernels. Shapes are
    in the argument comments; the module docstring gives the tiling."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, num_seqs, pid, C)
    q_start = tl.load(query_start_loc_ptr + seq)
    num_new = tl.load(query_start_loc_ptr + seq + 1) - q_start
    context_len = tl.load(seq_lens_ptr + seq)
    first_new = context_len - num_new  # position of the sequence's first new token
    tok0 = (pid - (q_start // C.BLOCK_M + seq)) * C.BLOCK_M  # first new token of this tile

    d = tl.arange(0, C.BLOCK_D)
    d_ok = d < C.HEAD_DIM
    kv_col = kvh * C.HEAD_DIM + d
    _write_cache(k_ptr, v_ptr, slot_mapping_ptr, key_cache_out_ptr, value_cache_out_ptr,
                 q_start, tok0, num_new, kv_col, d_ok, C)  # fmt: skip

    num_attend = num_new  # new tokens whose attention this kernel computes
    if SPLIT_DECODE:
        num_attend = tl.where(num_new == 1, 0, num_new)
    # Query rows: token tok0 + r // GROUP_PAD, query head kvh * GROUP + r % GROUP_PAD.
    rows = tl.arange(0, C.BLOCK_M * C.GROUP_PAD)
    tok = tok0 + rows // C.GROUP_PAD
    g = rows % C.GROUP_PAD
    row_ok = (tok < num_attend) & (g < C.GROUP)
    pos = first_new + tok
    head = kvh * C.GROUP + g
    row_off = (q_start + tok).to(tl.int64) * (C.NUM_HEADS * C.HEAD_DIM) + head * C.HEAD_DIM
    q_off = row_off[:, None] + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Keys this tile can see: [kv_lo, kv_hi).
    kv_hi = tl.minimum(first_new + tok0 + C.BLOCK_M, context_len)
    kv_lo = 0
    if C.SLIDING_WINDOW > 0:
        kv_lo = tl.maximum(first_new + tok0 - C.SLIDING_WINDOW + 1, 0)
    kv_hi = tl.where(tok0 < num_attend, kv_hi, kv_lo)

    table_row = block_tables_ptr + seq.to(tl.int64) * max_blocks
    _, l_i, acc = attend(
        q, pos, row_ok, k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, table_row, q_start,
        first_new, kv_lo, kv_hi, kv_col, d_ok, C,
    )  # fmt: skip
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + q_off,
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
