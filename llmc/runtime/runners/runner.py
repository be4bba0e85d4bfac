"""The runner protocol: one step in, logits out (DESIGN §7)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from llmc.runtime.runners.step_inputs import StepInputs


class Runner(Protocol):
    """Executes the model on one packed step and owns the paged KV cache.

    Implementations: ``OrtRunner`` (CPU engines), ``TrtRunner`` (TensorRT engines) and
    ``llmc.compiler.frontend.torch_runner.TorchRunner`` (the eager reference).
    """

    num_blocks: int
    block_size: int
    vocab_size: int

    def execute(self, step: StepInputs) -> np.ndarray:
        """Run one step; returns logits [S, vocab] float32 for ``step.logits_indices``.

        The KV cache is updated in place at ``step.slot_mapping``.
        """
        ...
