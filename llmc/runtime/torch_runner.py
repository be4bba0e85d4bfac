"""The torch eager reference runner: the HF model itself, attention through the torch reference.

Used by tests and ``llmc verify`` as the ground truth a compiled engine is compared with; it runs
the same ``StepInputs`` contract as the engine runners, over its own paged KV cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llmc.compiler.export import cache_spec
from llmc.compiler.packed_model import PackedCausalLM
from llmc.runtime.step_inputs import StepInputs


class TorchRunner:
    """Eager runner over a transformers causal LM. Implements ``llmc.runtime.runner.Runner``.

    Args:
        model: a checkpoint directory (safetensors) or an already loaded transformers model
            whose ``attn_implementation`` is llmc's (``llmc.compiler.attention``).
        num_blocks: KV blocks per layer.
        block_size: tokens per KV block.
    """

    def __init__(self, model: str | Path | torch.nn.Module, num_blocks: int, block_size: int):
        from llmc.compiler.attention import register_attention

        name = register_attention()
        if not isinstance(model, torch.nn.Module):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                str(model), attn_implementation=name, dtype=torch.float32
            )
        model.set_attn_implementation(name)
        self.model = PackedCausalLM(model.eval())
        spec = cache_spec(model)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = int(model.config.vocab_size)
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=spec.dtype) for _ in range(2 * spec.num_layers)]

    @torch.inference_mode()
    def execute(self, step: StepInputs) -> np.ndarray:
        """Run one step; returns logits [len(step.logits_indices), vocab] float32."""
        t = torch.from_numpy
        logits = self.model(
            t(step.input_ids),
            t(step.positions),
            t(step.logits_indices),
            t(step.seq_lens),
            t(step.query_start_loc),
            t(step.block_tables),
            t(step.slot_mapping),
            *self.kv_caches,
        )
        return logits.numpy()
