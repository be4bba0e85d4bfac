"""The packed-token model: a causal LM called with one step's ``StepInputs`` (DESIGN §3).

Wraps a transformers causal LM whose attention is routed to the paged-attention op. Graph inputs
are exactly the plugin contract's: no padding, batch dimension 1, logits only for
``logits_indices``. Used for ONNX export and, eagerly, as the torch reference runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedMetadata:
    """Per-step attention metadata handed to every layer's attention call (shapes: StepInputs).

    ``kv_caches`` holds 2 * num_layers tensors [num_blocks, block_size, KVH, D]: layer i's key
    cache at 2i and value cache at 2i + 1.
    """

    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    kv_caches: list[torch.Tensor]


class PackedCausalLM(torch.nn.Module):
    """``forward(input_ids [T], positions [T], logits_indices [S], seq_lens [B],
    query_start_loc [B+1], block_tables [B, M], slot_mapping [T], *kv_caches) -> logits [S, V]``
    (float32)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        *kv_caches: torch.Tensor,
    ) -> torch.Tensor:
        meta = PagedMetadata(seq_lens, query_start_loc, block_tables, slot_mapping, list(kv_caches))
        out = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            logits_to_keep=logits_indices,
            use_cache=False,
            llmc_metadata=meta,
        )
        return out.logits[0].float()  # a Gather in the export; passes/no_op.py squeezes it
