"""The LoRA inputs of a step for an engine graph with adapter slots (``llmc.engine.lora``):
the slot tensors a runner holds, and each token's slot."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from llmc.engine.lora import LORA_SLOT_IDS, NO_SLOT, is_lora_input
from llmc.runtime.runners.step_inputs import StepInputs


def zero_slots(inputs: Iterable[tuple[str, Iterable]]) -> dict[str, np.ndarray]:
    """Zero-filled slot tensors (no adapter loaded) for the ``lora_a``/``lora_b`` inputs among
    ``inputs`` ((name, static shape) pairs of the graph or its segments), by name; empty for
    an engine without LoRA. Raises ValueError for a slot input without a static shape."""
    out: dict[str, np.ndarray] = {}
    for name, shape in inputs:
        if not is_lora_input(name) or name == LORA_SLOT_IDS or name in out:
            continue
        dims = list(shape)
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise ValueError(f"LoRA input {name} has no static shape: {dims}")
        out[name] = np.zeros(dims, np.float32)
    return out


def lora_feed(step: StepInputs, slots: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The LoRA inputs of ``step`` for a graph with ``slots`` (``zero_slots``, or the tensors
    an adapter table fills): the slot tensors and ``lora_slot_ids`` [T] int64 (the step's own,
    else every token on the base model); empty when ``slots`` is."""
    if not slots:
        return {}
    ids = step.lora_slot_ids
    if ids is None:
        ids = np.full(step.num_tokens, NO_SLOT, np.int64)
    return {**slots, LORA_SLOT_IDS: ids}
