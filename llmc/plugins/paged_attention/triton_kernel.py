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

Dtypes: q/k/v float32, float16 or bfloat16, loaded and converted to float32; ``Q K^T`` and
``P V`` take float32 operands: IEEE for float32 inputs, TF32 for 16-bit ones (TF32's 10-bit
mantissa holds fp16 and bf16 values exactly, so only P is rounded; the interpreter also cannot
multiply bf16 operands). Softmax in float32, the output rounded to q's dtype once.

The cache: q's dtype, int8 or FP8 E4M3FN, the FP8 one passed as its uint8 view. A quantized cache
holds ``saturate(round_half_even(x / scale))`` (IEEE division, ``div_rn``) and is read as
``float(code) * scale``, exactly as reference.py. FP8 codes are made and read with integer
arithmetic, not casts: the interpreter's float32 -> fp8 cast rounds ties away from zero and
flushes subnormals (measured here), and the same code then runs on every GPU (no sm89 conversion
instructions). Layer constants (heads, scale, window, soft-cap, KV scales) are compile-time
constants: TensorRT's AOT launch passes only int32 scalars, and a JIT run compiles one kernel
per distinct set (a few per model).

Tile sizes and the torch launcher are in :mod:`llmc.plugins.paged_attention.triton_launch`; the
TensorRT plugin (:mod:`llmc.plugins.paged_attention.trt_plugin`) compiles this same kernel ahead
of time. Import this module only where Triton is used: it imports ``triton`` (and raises
:class:`~llmc.errors.LlmcError` when it is missing). For the CPU interpreter set
``TRITON_INTERPRET=1`` before this module is first imported (``@triton.jit`` reads it).
"""

from __future__ import annotations

from llmc.errors import LlmcError

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised only where triton is absent
    raise LlmcError(
        "the Triton paged-attention kernel needs triton: pip install triton==3.9.0 "
        "(or pip install -e '.[dev]')"
    ) from error

#: Kernel parameters in order: input pointers, the int32 scalars, output pointers (the order
#: TensorRT's AOT launch passes them), then the compile-time constants.
POINTER_INPUTS = (
    "q_ptr", "k_ptr", "v_ptr", "key_cache_ptr", "value_cache_ptr", "seq_lens_ptr",
    "query_start_loc_ptr", "block_tables_ptr", "slot_mapping_ptr",
)  # fmt: skip
SCALAR_INPUTS = ("num_seqs", "max_blocks")
POINTER_OUTPUTS = ("out_ptr", "key_cache_out_ptr", "value_cache_out_ptr")


@triton.jit
def _tanh(x):
    # 2 / (1 + e^-2x) - 1: saturates to +-1 without overflow (tl has no portable tanh).
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _round_half_even(x):
    floor = tl.floor(x)
    frac = x - floor
    odd = (floor - 2.0 * tl.floor(floor * 0.5)) != 0.0
    return floor + ((frac > 0.5) | ((frac == 0.5) & odd)).to(tl.float32)


@triton.jit
def _fp8_round(y):
    """float32 in [-448, 448] -> the nearest FP8 E4M3FN value (ties to even), as float32.

    Arithmetic, not a cast: the interpreter's cast rounds ties away and flushes subnormals, and
    the same code then runs everywhere (FP8 storage needs no sm89 conversion instructions)."""
    a = tl.abs(y)
    exponent = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    # Spacing of E4M3 values near a: 2^(e-3) in binade [2^e, 2^(e+1)); 2^-9 below 2^-6.
    step = (tl.maximum(exponent - 3, 127 - 9) << 23).to(tl.float32, bitcast=True)
    r = _round_half_even(a / step) * step  # division by a power of two: exact
    return tl.where(y.to(tl.int32, bitcast=True) < 0, -r, r)  # the sign bit: -0.0 too


@triton.jit
def _fp8_bits(r):
    """An E4M3FN value (float32, from _fp8_round) -> its code: sign, 4 exponent bits (bias 7),
    3 mantissa bits; below 2^-6 the code is r * 2^9 (subnormals and 2^-6 itself)."""
    bits = r.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(r)
    a_bits = a.to(tl.int32, bitcast=True)
    normal = ((((a_bits >> 23) & 0xFF) - 120) << 3) | ((a_bits >> 20) & 7)
    subnormal = (a * 512.0).to(tl.int32)
    return tl.where(a < 0.015625, subnormal, normal) | sign


@triton.jit
def _fp8_value(code):
    """E4M3FN code (int32 0..255) -> float32 value (the NaN codes, never written, read as 480)."""
    exponent = (code >> 3) & 15
    mantissa = code & 7
    power = ((exponent + 117) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 10)
    magnitude = tl.where(
        exponent == 0, mantissa.to(tl.float32) * 0.001953125, (8 + mantissa).to(tl.float32) * power
    )
    return tl.where((code & 0x80) != 0, -magnitude, magnitude)


@triton.jit
def _quantize(x, scale, CACHE_QUANT: tl.constexpr):
    """float32 values -> cache codes as float32 (exact in the cache dtype); identity unquantized."""
    y = x
    if CACHE_QUANT == 1:
        y = _fp8_round(tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0))
    elif CACHE_QUANT == 2:
        y = tl.minimum(tl.maximum(_round_half_even(tl.div_rn(x, scale)), -127.0), 127.0)
    return y


@triton.jit
def _dequantize(codes, scale, CACHE_QUANT: tl.constexpr):
    """Cache codes as float32 -> values: ``code * scale`` for a quantized cache."""
    values = codes
    if CACHE_QUANT != 0:
        values = codes * scale
    return values


@triton.jit
def _load_codes(ptr, offsets, mask, CACHE_QUANT: tl.constexpr):
    """Cache codes as float32 (an FP8 cache is passed as its uint8 view)."""
    raw = tl.load(ptr + offsets, mask=mask, other=0)
    codes = raw.to(tl.float32)
    if CACHE_QUANT == 1:
        codes = _fp8_value(raw.to(tl.int32))
    return codes


@triton.jit
def _store_codes(ptr, offsets, codes, mask, CACHE_QUANT: tl.constexpr):
    if CACHE_QUANT == 1:
        tl.store(ptr + offsets, _fp8_bits(codes).to(tl.uint8), mask=mask)
    else:
        tl.store(ptr + offsets, codes.to(ptr.dtype.element_ty), mask=mask)


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
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SCALE: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    LOGIT_SOFTCAP: tl.constexpr,
    CACHE_QUANT: tl.constexpr,
    K_SCALE: tl.constexpr,
    V_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: BLOCK_M query tokens of one sequence x the GROUP query heads of KV head
    ``program_id(1)``; grid (T // BLOCK_M + B, KVH), launched by ``triton_launch``. Writes the
    tile's new K/V rows into the cache at ``slot_mapping`` (quantized per CACHE_QUANT with
    K_SCALE/V_SCALE) and out [T, H*D] = softmax(soft-capped, windowed, causal QK^T * SCALE) V,
    computed with FlashAttention-2's online softmax (Dao 2023) over BLOCK_N keys at a time read
    through the block table (vLLM's PagedAttention, Kwon et al. 2023). Shapes are in the
    argument comments; the module docstring gives the tiling."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    # The sequence of this query tile: the last b with query_start_loc[b] // BLOCK_M + b <= pid.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    num_new = tl.load(query_start_loc_ptr + seq + 1) - q_start
    context_len = tl.load(seq_lens_ptr + seq)
    first_new = context_len - num_new  # position of the sequence's first new token
    tok0 = (pid - (q_start // BLOCK_M + seq)) * BLOCK_M  # first new token of this tile

    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    kv_row = NUM_KV_HEADS * HEAD_DIM
    kv_col = kvh * HEAD_DIM + d

    # Cache write: this tile's tokens, this KV head.
    wt = tok0 + tl.arange(0, BLOCK_M)
    w_mask = (wt < num_new)[:, None] & d_ok[None, :]
    w_tok = (q_start + wt).to(tl.int64)
    slots = tl.load(slot_mapping_ptr + w_tok, mask=wt < num_new, other=0).to(tl.int64)
    src = w_tok[:, None] * kv_row + kv_col[None, :]
    dst = slots[:, None] * kv_row + kv_col[None, :]
    new_k = _quantize(tl.load(k_ptr + src, mask=w_mask).to(tl.float32), K_SCALE, CACHE_QUANT)
    new_v = _quantize(tl.load(v_ptr + src, mask=w_mask).to(tl.float32), V_SCALE, CACHE_QUANT)
    _store_codes(key_cache_out_ptr, dst, new_k, w_mask, CACHE_QUANT)
    _store_codes(value_cache_out_ptr, dst, new_v, w_mask, CACHE_QUANT)

    # Query rows: token tok0 + r // GROUP_PAD, query head kvh * GROUP + r % GROUP_PAD.
    rows = tl.arange(0, BLOCK_M * GROUP_PAD)
    tok = tok0 + rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (tok < num_new) & (g < GROUP)
    pos = first_new + tok
    head = kvh * GROUP + g
    q_off = (
        (q_start + tok).to(tl.int64)[:, None] * (NUM_HEADS * HEAD_DIM)
        + (head * HEAD_DIM)[:, None]
        + d[None, :]
    )
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)

    # Keys this tile can see: [kv_lo, kv_hi).
    kv_hi = tl.minimum(first_new + tok0 + BLOCK_M, context_len)
    kv_lo = 0
    if SLIDING_WINDOW > 0:
        kv_lo = tl.maximum(first_new + tok0 - SLIDING_WINDOW + 1, 0)
    kv_hi = tl.where(tok0 < num_new, kv_hi, kv_lo)

    m_i = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * max_blocks
    for j0 in range(kv_lo, kv_hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        in_range = j < kv_hi
        old = in_range & (j < first_new)  # in the cache before this step
        new = in_range & (j >= first_new)  # this step's tokens: from k/v
        block = tl.load(table_row + j // BLOCK_SIZE, mask=old, other=0).to(tl.int64)
        cache_off = (block * BLOCK_SIZE + j % BLOCK_SIZE)[:, None] * kv_row + kv_col[None, :]
        input_off = (q_start + j - first_new).to(tl.int64)[:, None] * kv_row + kv_col[None, :]
        old_mask = old[:, None] & d_ok[None, :]
        new_mask = new[:, None] & d_ok[None, :]

        # Keys as float32 values, through the cache's quantization whichever way they come.
        keys_old = _load_codes(key_cache_ptr, cache_off, old_mask, CACHE_QUANT)
        keys_new = tl.load(k_ptr + input_off, mask=new_mask, other=0.0).to(tl.float32)
        keys_new = _quantize(keys_new, K_SCALE, CACHE_QUANT)
        keys = _dequantize(tl.where(new[:, None], keys_new, keys_old), K_SCALE, CACHE_QUANT)
        scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION)
        scores = scores * SCALE
        if LOGIT_SOFTCAP > 0:
            scores = LOGIT_SOFTCAP * _tanh(scores / LOGIT_SOFTCAP)
        visible = row_ok[:, None] & in_range[None, :] & (j[None, :] <= pos[:, None])
        if SLIDING_WINDOW > 0:
            visible = visible & (j[None, :] > pos[:, None] - SLIDING_WINDOW)
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row with nothing visible yet keeps m = -inf; exp(-inf - 0) = 0 keeps it empty.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        values_old = _load_codes(value_cache_ptr, cache_off, old_mask, CACHE_QUANT)
        values_new = tl.load(v_ptr + input_off, mask=new_mask, other=0.0).to(tl.float32)
        values_new = _quantize(values_new, V_SCALE, CACHE_QUANT)
        values = _dequantize(tl.where(new[:, None], values_new, values_old), V_SCALE, CACHE_QUANT)
        pv = tl.dot(p, values, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    out_off = (
        (q_start + tok).to(tl.int64)[:, None] * (NUM_HEADS * HEAD_DIM)
        + (head * HEAD_DIM)[:, None]
        + d[None, :]
    )
    tl.store(
        out_ptr + out_off,
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
