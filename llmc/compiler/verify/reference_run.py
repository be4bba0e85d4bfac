"""The unquantized graph ``llmc verify`` checks an engine against, written and run as a build's
accuracy report runs it: one segment's weights in memory at a time.

The graph is exported from the checkpoint's model on the meta device with every weight bound to
the checkpoint and written to a work directory (``streamed_export.write_float_graph``, through
the export cache), so verifying a 1B-class engine never holds the float32 model, nor a proto
past protobuf's 2 GB. One ``LayerwiseRunner`` pass over the held-out windows writes their logits
to a file (scored against the engine's afterwards, ``accuracy.engine_logit_chunks``) and keeps
the tensors at every segment boundary of the first window, from which each engine segment is
compared (``segment_compare``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from llmc.compiler.frontend.model_source import ModelSource
from llmc.compiler.frontend.onnx_export import LoRASlots
from llmc.compiler.frontend.streamed_export import meta_model, write_float_graph
from llmc.compiler.memory.plan import MAX_IN_FLIGHT_BYTES
from llmc.compiler.quantize.search.assignment_eval import LOGITS_ROWS
from llmc.compiler.stages.export import FloatGraph
from llmc.compiler.stages.progress import Stage
from llmc.compiler.weights.stored_weights import segment_widener
from llmc.engine.lora import LoRALayout
from llmc.runtime.runners.layerwise_runner import LayerwiseRunner


def reference_graph(
    src: ModelSource,
    digest: str,
    block_size: int,
    work_dir: Path,
    stage: Stage,
    lora: dict | None = None,
) -> FloatGraph:
    """The unquantized engine graph of checkpoint ``src`` (sha256 ``digest``) with
    ``block_size``-token KV blocks and the adapter slots of the manifest record ``lora``
    (``LoRALayout.to_dict``; the runner feeds them empty, so the reference is the base model),
    written to ``work_dir`` with its weights as external data there; the returned proto holds
    references to them. Raises ModelSourceError when a graph weight is not in the
    checkpoint."""
    slots = None
    if lora is not None:
        layout = LoRALayout.from_dict(lora)
        slots = LoRASlots(layout.max_loras, layout.max_lora_rank, layout.target_modules)
    meta = meta_model(src, digest)
    path, report = write_float_graph(
        src, meta, block_size, work_dir, MAX_IN_FLIGHT_BYTES, stage, lora=slots
    )
    del meta
    return FloatGraph(onnx.load(str(path), load_external_data=False), report, work_dir)


def reference_runner(graph: FloatGraph, threads: int, boundaries: tuple[str, ...]):
    """A ``LayerwiseRunner`` of ``graph`` that returns the ``boundaries`` tensors beside the
    logits, which it computes ``LOGITS_ROWS`` positions at a time."""
    return LayerwiseRunner(
        graph.proto,
        threads=threads,
        extra_outputs=boundaries,
        external_data_dir=graph.weights_dir,
        prepare=segment_widener(graph.weights_dir),
        logits_rows=LOGITS_ROWS,
    )


def run_reference(
    runner: LayerwiseRunner, windows: list[np.ndarray], spill, progress=None
) -> tuple[list[tuple[int, int]], dict[str, np.ndarray]]:
    """Run ``runner`` over ``windows`` ([T] int64 token ids each) once: write each window's
    logits [T, V] float32 to the binary file ``spill`` in window order (``spill_logits``'
    layout) and keep the first window's tensors: its step inputs, what each segment and plugin
    gives it, and its logits whole under ``runner.logits``. Returns ([rows, vocab] per
    window, the first window's tensors by name). ``progress(done, total)`` counts segments."""
    rows = [0] * len(windows)
    vocab = 0
    first: dict[str, np.ndarray] = {}
    first_logits: list[np.ndarray] = []
    last = runner.num_segments - 1
    keep: dict = dict.fromkeys(range(runner.num_segments))  # what each segment starts from
    for out in runner.run(windows, progress, keep=keep):
        if out.window is None:  # the segment ran over every window: keep the first's inputs
            first.update(keep.pop(out.segment).envs[0])
            continue
        tensors = dict(out.tensors)
        logits = tensors.pop(runner.logits, None)
        if out.window == 0:
            first.update(tensors)
        if out.segment == last and logits is not None:
            logits = np.ascontiguousarray(logits, np.float32)
            spill.write(memoryview(logits).cast("B"))
            rows[out.window] += logits.shape[0]
            vocab = logits.shape[1]
            if out.window == 0:
                first_logits.append(logits)
    first[runner.logits] = np.concatenate(first_logits)
    return [(n, vocab) for n in rows], first
