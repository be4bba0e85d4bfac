"""The torch reference of ``llmc::PagedAttention``: the ground truth every kernel is tested against.

Written for obviousness, not speed: one loop over sequences, the context gathered from the block
table, a dense mask, a float32 softmax. DESIGN §3 states the contract.
"""

from __future__ import annotations

import torch


def paged_attention_reference(
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
) -> torch.Tensor:
    """Write the new tokens' keys and values into the paged cache, then attend causally.

    Args:
        q: [T, H*D] float32 or bfloat16, the queries of T packed new tokens.
        k, v: [T, KVH*D], same dtype as ``q``, the new tokens' keys and values.
        key_cache, value_cache: [num_blocks, block_size, KVH, D], same dtype, contiguous. Written
            in place: row ``slot_mapping[t]`` of the flattened ``[num_blocks*block_size, KVH, D]``
            view receives token t's key (value).
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

    The n new tokens of sequence b are the last n positions of its context: new token i sits at
    position ``seq_lens[b] - n + i``. Scores and softmax are computed in float32.

    Returns:
        [T, H*D] in ``q``'s dtype.

    Raises:
        ValueError: ``num_heads`` is not a multiple of ``num_kv_heads``.
    """
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    num_tokens = q.shape[0]
    block_size = key_cache.shape[1]
    group = num_heads // num_kv_heads

    # The cache write comes first: a new token attends to itself and to the tokens before it in
    # the same step, which it can only see once they are in the cache.
    slots = slot_mapping.long()
    rows = (-1, num_kv_heads, head_dim)
    key_cache.view(rows)[slots] = k.view(rows)  # .view, not .reshape: it must write in place
    value_cache.view(rows)[slots] = v.view(rows)

    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype)
    for b in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        num_new, context_len = end - start, int(seq_lens[b])
        if num_new == 0:
            continue
        num_blocks = -(-context_len // block_size)
        blocks = block_tables[b, :num_blocks].long()
        # keys, values: [L, KVH, D] -> [L, H, D], each KV head repeated for its query heads.
        keys = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        values = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
        keys = keys.float().repeat_interleave(group, dim=1)
        values = values.float().repeat_interleave(group, dim=1)
        queries = q[start:end].float().view(num_new, num_heads, head_dim)

        scores = torch.einsum("nhd,lhd->hnl", queries, keys) * scale  # [H, n, L]
        if logit_softcap is not None:
            scores = logit_softcap * torch.tanh(scores / logit_softcap)
        positions = torch.arange(context_len - num_new, context_len)[:, None]  # [n, 1]
        key_positions = torch.arange(context_len)[None, :]  # [1, L]
        visible = key_positions <= positions
        if sliding_window is not None:
            visible &= key_positions > positions - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hnl,lhd->nhd", probs, values).to(q.dtype)
    return out.view(num_tokens, num_heads * head_dim)
