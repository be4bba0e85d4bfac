"""The packed-token model: a causal LM called with one step's ``StepInputs`` (DESIGN §3).

Wraps a transformers causal LM whose attention is routed to the paged-attention op. Graph inputs
are exactly the plugin contract's: no padding, batch dimension 1, logits only for
``logits_indices``. Used for ONNX export and, eagerly, as the torch reference runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from llmc.compiler.frontend.lora_slots import LoRAStepTensors
    from llmc.engine.lora import LoRALayout


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
    query_start_loc [B+1], block_tables [B, M], slot_mapping [T], *kv_caches, *lora) -> logits
    [S, V]`` (float32). With ``lora`` (a layout and the step tensors of the model's slot hooks,
    ``lora_slots.attach_lora_slots``), the last inputs are ``LoRALayout.input_names``' tensors:
    slot ids [T] int64, then A and B of each module."""

    def __init__(
        self, model: torch.nn.Module, lora: tuple[LoRALayout, LoRAStepTensors] | None = None
    ):
        super().__init__()
        self.model = model
        self.lora = lora

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
        if self.lora is not None:
            kv_caches = self._bind_lora(kv_caches)
        meta = PagedMetadata(seq_lens, query_start_loc, block_tables, slot_mapping, list(kv_caches))
        out = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            logits_to_keep=logits_indices,
            use_cache=False,
            llmc_metadata=meta,
        )
        return out.logits[0].float()  # a Gather in the export; passes/no_op.py squeezes it

    def _bind_lora(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Hand the trailing LoRA inputs of ``tensors`` to the slot hooks; the caches before."""
        from llmc.compiler.frontend.lora_slots import slot_mask

        layout, step = self.lora
        n = 1 + 2 * len(layout.modules)
        caches, lora = tensors[:-n], tensors[-n:]
        step.mask = slot_mask(lora[0], layout.max_loras)
        pairs = zip(lora[1::2], lora[2::2], strict=True)
        step.weights = dict(zip(layout.modules, pairs, strict=True))
        return caches
