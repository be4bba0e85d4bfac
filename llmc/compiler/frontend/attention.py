"""Route a transformers model's attention through the ``llmc::paged_attention`` op (DESIGN §4).

``transformers.AttentionInterface`` lets any model that uses the attention interface (Llama,
Mistral, Qwen, Gemma 2/3, Phi-3, ...) call our function instead of its own, with no per-model
code. The function calls a ``torch.library.custom_op`` whose eager implementation is the torch
reference (it writes the KV cache in place) and whose fake implementation lets
``torch.export`` trace it; the ONNX translation emits one ``llmc::PagedAttention`` node per layer.
"""

from __future__ import annotations

import torch

from llmc.engine.plugin import (
    PluginAttributes,
    PluginInputs,
    bind_node_call,
    node_call,
    with_node_signature,
)
from llmc.plugins.paged_attention.reference import paged_attention_reference

ATTN_IMPLEMENTATION = "llmc_paged"


def _eager(*args: object, **kwargs: object) -> torch.Tensor:
    """Eager implementation: the torch reference. q [T, H*D] -> [T, H*D].

    Declared without ``mutates_args`` on purpose: the cache write is a side effect the exported
    graph must keep as one plugin node, not a functionalized copy of the cache (DESIGN §3: the
    cache is never copied). Only eager code (``TorchRunner``, tests) runs this body.
    """
    inputs, attributes = bind_node_call(args, kwargs)
    return paged_attention_reference(*inputs, **attributes.kernel_arguments())


#: The op: the plugin's inputs, then its exported attributes (``with_node_signature``).
paged_attention_op = torch.library.custom_op(
    "llmc::paged_attention", with_node_signature(_eager, torch.Tensor), mutates_args=()
)


@paged_attention_op.register_fake
def _(q, *args) -> torch.Tensor:
    return torch.empty_like(q)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query [1, H, T, D], key/value [1, KVH, T, D].

    The packed metadata arrive through the model's forward kwargs (``llmc_metadata``, a
    ``PagedMetadata``). Returns ``([1, T, H, D], None)`` as transformers expects.
    """
    meta = kwargs["llmc_metadata"]
    _, num_heads, num_tokens, head_dim = query.shape
    num_kv_heads = key.shape[1]
    layer_idx = module.layer_idx
    key_cache, value_cache = meta.kv_caches[2 * layer_idx], meta.kv_caches[2 * layer_idx + 1]
    # [1, H, T, D] -> [T, H*D]: tokens are packed, the batch dimension is always 1.
    q = query.transpose(1, 2).reshape(num_tokens, num_heads * head_dim)
    k = key.transpose(1, 2).reshape(num_tokens, num_kv_heads * head_dim)
    v = value.transpose(1, 2).reshape(num_tokens, num_kv_heads * head_dim)
    inputs = PluginInputs(
        q, k, v, key_cache, value_cache,
        meta.seq_lens, meta.query_start_loc, meta.block_tables, meta.slot_mapping,
    )  # fmt: skip
    attributes = PluginAttributes(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scale=float(scaling if scaling is not None else head_dim**-0.5),
        sliding_window=int(sliding_window or 0),
        logit_softcap=float(softcap or 0.0),
        block_size=int(key_cache.shape[1]),
        layer_idx=int(layer_idx),
    )
    out = paged_attention_op(*node_call(inputs, attributes))
    return out.view(1, num_tokens, num_heads, head_dim), None


def register_attention() -> str:
    """Register ``paged_attention_forward`` with transformers; returns the implementation name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
