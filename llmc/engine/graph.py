"""The engine graph's interface (DESIGN §3): one step's inputs, the KV caches, the logits.

The exporter names the graph's tensors so, the TensorRT lowering keeps them, and the runners
bind them by these names (the fields of ``llmc.runtime.runners.step_inputs.StepInputs`` carry the
same).
"""

from __future__ import annotations

#: A step's metadata inputs, in graph order; the caches follow (``cache_names``).
STEP_INPUTS = (
    "input_ids",
    "positions",
    "logits_indices",
    "seq_lens",
    "query_start_loc",
    "block_tables",
    "slot_mapping",
)

#: The graph's output: logits [S, vocab] float32, one row per ``logits_indices`` entry.
LOGITS = "logits"


def cache_names(num_layers: int) -> list[str]:
    """Graph input names of the caches: key_cache.0, value_cache.0, key_cache.1, ..."""
    return [f"{kind}.{i}" for i in range(num_layers) for kind in ("key_cache", "value_cache")]
