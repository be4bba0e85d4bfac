"""The torch reference of ``llmc::PagedAttention``: the ground truth every kernel is tested against.

Written for obviousness, not speed: one loop over sequences, the context gathered from the block
table, a dense mask, a float32 softmax. DESIGN §3 states the contract.

A quantized KV cache (``--kv-cache-dtype fp8|int8``) is quantized as it is written and
dequantized as it is read, with one scale per layer for keys and one for values (vLLM's
per-tensor ``k_scale``/``v_scale``): ``q = saturate(round_half_even(x / scale))`` and
``x = float(q) * scale``, in float32. FP8 is E4M3FN of the OCP 8-bit floating point spec
(Micikevicius et al. 2022, "FP8 Formats for Deep Learning"): 4 exponent bits with bias 7, 3
mantissa bits, no infinities, largest finite value 448. int8 is symmetric: zero point 0, codes
[-127, 127] (-128 unused, so that the range is symmetric).
"""

from __future__ import annotations

import torch

from llmc.engine.plugin import KernelArguments, PluginInputs, plugin_kernel

#: Saturation bound of each quantized cache dtype, in quantization steps (units of the scale).
QUANTIZED_CACHE_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """``saturate(round_half_even(x / scale))`` in ``dtype`` (float32 division); an unquantized
    ``dtype`` is a plain cast and ignores ``scale``. ``x``: any shape, a float dtype."""
    if dtype not in QUANTIZED_CACHE_MAX:
        return x.to(dtype)
    bound = QUANTIZED_CACHE_MAX[dtype]
    scaled = x.float() / torch.tensor(scale, dtype=torch.float32)
    if dtype == torch.int8:
        scaled = torch.round(scaled)  # half to even; fp8's cast rounds to nearest even itself
    # Why clamp before the cast: a cast need not saturate (ml_dtypes' gives NaN past 448).
    return scaled.clamp(-bound, bound).to(dtype)


def dequantize_kv(codes: torch.Tensor, scale: float) -> torch.Tensor:
    """``float(codes) * scale`` in float32 for a quantized ``codes``; else ``codes.float()``."""
    if codes.dtype not in QUANTIZED_CACHE_MAX:
        return codes.float()
    return codes.float() * torch.tensor(scale, dtype=torch.float32)


@plugin_kernel
def paged_attention_reference(inputs: PluginInputs, a: KernelArguments) -> torch.Tensor:
    """Write the new tokens' keys and values into the paged cache, then attend causally.

    Args:
        q: [T, H*D] float32 or bfloat16, the queries of T packed new tokens.
        k, v: [T, KVH*D], same dtype as ``q``, the new tokens' keys and values.
        key_cache, value_cache: [num_blocks, block_size, KVH, D], contiguous, both in ``q``'s
            dtype or both quantized (``torch.float8_e4m3fn`` or ``torch.int8``). Written in
            place: row ``slot_mapping[t]`` of the flattened ``[num_blocks*block_size, KVH, D]``
            view receives token t's key (value), quantized with ``k_scale`` (``v_scale``).
        seq_lens: [B] int32, each sequence's context length after this step (cached + new).
        query_start_loc: [B+1] int32, prefix sums of new tokens; sequence b owns tokens
            ``query_start_loc[b]:query_start_loc[b+1]``.
        block_tables: [B, max_blocks] int32, block ids of each sequence's context in order;
            entries past its last block are padding and never read.
        slot_mapping: [T] int64, ``block_id * block_size + offset`` of each new token.
        num_heads, num_kv_heads, head_dim: H, KVH, D. Query head h reads KV head
            ``h // (H // KVH)`` (GQA; MQA is KVH = 1).
        scale: multiplies q·k (usually ``D ** -0.5``).
        sliding_window: W, or None for full attention. A token at position p sees positions
            j with ``p - W < j <= p`` (the window holds W tokens including itself, as in HF
            transformers).
        logit_softcap: c, or None. Scores become ``c * tanh(score / c)`` (Gemma 2).
        k_scale, v_scale: a quantized cache's per-tensor scales (key or value units per
            quantization step; see the module docstring); unused by an unquantized cache.

    The n new tokens of sequence b are the last n positions of its context: new token i sits at
    position ``seq_lens[b] - n + i``. Scores and softmax are computed in float32. The signature
    is the plugin's (``llmc.engine.plugin.plugin_kernel``): the inputs positional, the rest
    keywords.

    Returns:
        [T, H*D] in ``q``'s dtype.

    Raises:
        ValueError: ``num_heads`` is not a multiple of ``num_kv_heads``, or the caches' dtypes
            differ.
    """
    num_heads, num_kv_heads, head_dim = a.num_heads, a.num_kv_heads, a.head_dim
    q, key_cache, value_cache = inputs.q, inputs.key_cache, inputs.value_cache
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if key_cache.dtype != value_cache.dtype:
        raise ValueError(f"cache dtypes differ: {key_cache.dtype} and {value_cache.dtype}")
    num_tokens = q.shape[0]
    block_size = key_cache.shape[1]
    group = num_heads // num_kv_heads

    # The cache write comes first: a new token attends to itself and to the tokens before it in
    # the same step, which it can only see once they are in the cache.
    slots = inputs.slot_mapping.long()
    rows = (-1, num_kv_heads, head_dim)
    # .view, not .reshape: it must write in place.
    key_cache.view(rows)[slots] = quantize_kv(inputs.k.view(rows), key_cache.dtype, a.k_scale)
    value_cache.view(rows)[slots] = quantize_kv(inputs.v.view(rows), value_cache.dtype, a.v_scale)

    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype)
    for b in range(inputs.seq_lens.shape[0]):
        start, end = int(inputs.query_start_loc[b]), int(inputs.query_start_loc[b + 1])
        num_new, context_len = end - start, int(inputs.seq_lens[b])
        if num_new == 0:
            continue
        num_blocks = -(-context_len // block_size)
        blocks = inputs.block_tables[b, :num_blocks].long()
        # keys, values: [L, KVH, D] -> [L, H, D], each KV head repeated for its query heads.
        keys = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        values = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        keys = dequantize_kv(keys, a.k_scale).repeat_interleave(group, dim=1)
        values = dequantize_kv(values, a.v_scale).repeat_interleave(group, dim=1)
        queries = q[start:end].float().view(num_new, num_heads, head_dim)
        out[start:end] = _attend(queries, keys, values, context_len, a).to(q.dtype)
    return out.view(num_tokens, num_heads * head_dim)


def _attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    context_len: int,
    a: KernelArguments,
) -> torch.Tensor:
    """Scaled, soft-capped, causal, windowed softmax attention of one sequence's n new tokens
    (the last n of its ``context_len`` positions): queries [n, H, D], keys and values [L, H, D],
    all float32; returns [n, H, D] float32."""
    num_new = queries.shape[0]
    scores = torch.einsum("nhd,lhd->hnl", queries, keys) * a.scale  # [H, n, L]
    if a.logit_softcap is not None:
        scores = a.logit_softcap * torch.tanh(scores / a.logit_softcap)
    positions = torch.arange(context_len - num_new, context_len)[:, None]  # [n, 1]
    key_positions = torch.arange(context_len)[None, :]  # [1, L]
    visible = key_positions <= positions
    if a.sliding_window is not None:
        visible &= key_positions > positions - a.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, values)
