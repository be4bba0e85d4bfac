"""The torch eager reference runner: the HF model itself, attention through the torch reference.

The ground truth a compiled engine is compared with (tests): the packed model the compiler
exports (``packed_model.py``, ``attention.py``), run eagerly. It lives with the compiler because
it is the compiler's model before export; it implements the runtime's ``Runner`` protocol over
its own paged KV cache, so the scheduler can drive it like an engine runner.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llmc.compiler.frontend.attention import register_attention
from llmc.compiler.frontend.packed_model import PackedCausalLM
from llmc.engine.kv_cache import cache_spec
from llmc.runtime.runners.step_inputs import StepInputs


class TorchRunner:
    """Eager runner over a transformers causal LM. Implements
    ``llmc.runtime.runners.runner.Runner``.

    Args:
        model: a checkpoint directory (safetensors) or an already loaded transformers model
            whose ``attn_implementation`` is llmc's (``attention.py``).
        num_blocks: KV blocks per layer.
        block_size: tokens per KV block.
    """

    def __init__(self, model: str | Path | torch.nn.Module, num_blocks: int, block_size: int):
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
