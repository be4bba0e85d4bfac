"""Export a loaded model to the unquantized engine graph: plugin nodes, then the graph passes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from llmc.compiler.config.export import ExportOptions
from llmc.compiler.frontend.onnx_export import LoRASlots, export_onnx
from llmc.compiler.frontend.streamed_export import write_float_graph
from llmc.compiler.passes import run_passes
from llmc.compiler.stages.load import LoadedModel
from llmc.compiler.stages.progress import Stage, no_stage


@dataclass(frozen=True)
class FloatGraph:
    """The unquantized engine graph (one ``llmc::PagedAttention`` node per layer, passes
    applied) and the pass report (rewrites per pass). The reference a quantized engine's
    accuracy is measured against. ``weights_dir``: where the external data its initializers
    name is (a streamed build), or None when ``proto`` holds the weights."""

    proto: onnx.ModelProto
    pass_report: dict[str, int]
    weights_dir: Path | None = None


def export(
    model: LoadedModel,
    options: ExportOptions,
    stage: Stage = no_stage,
    work_dir: Path | None = None,
    in_flight_bytes: int = 0,
    share_tied: bool = False,
) -> FloatGraph:
    """The unquantized engine graph of ``model`` with ``options.block_size``-token KV blocks.

    A streamed ``model`` (``LoadedModel.streamed``) is written to ``work_dir`` with its weights
    as external data, at most ``in_flight_bytes`` read and not yet written, and the returned
    proto holds references to them, not the weights. ``share_tied``: run the ``tied_weights``
    pass (unquantized builds: a tied embedding table stored once)."""
    optional = frozenset({"tied_weights"}) if share_tied else frozenset()
    lora = lora_slots(options)
    if model.streamed is None:
        return FloatGraph(*float_graph(model.hf_model, options.block_size, stage, optional, lora))
    if work_dir is None:
        raise ValueError("a streamed model is exported into a work directory")
    path, pass_report = write_float_graph(
        model.resolved.source,
        model.streamed,
        options.block_size,
        work_dir,
        in_flight_bytes,
        stage,
        optional,
        lora,
    )
    return FloatGraph(onnx.load(str(path), load_external_data=False), pass_report, work_dir)


def float_graph(
    hf_model: Any,
    block_size: int,
    stage: Stage = no_stage,
    optional_passes: frozenset[str] = frozenset(),
    lora: LoRASlots | None = None,
) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The unquantized engine graph of a loaded transformers model: export with plugin nodes
    (and the adapter slots ``lora``), then the graph passes. Returns the graph and the pass
    report (rewrites per pass); also the reference ``llmc verify`` compares an engine with."""
    import onnx_ir as ir

    with stage("export to ONNX"):
        proto = export_onnx(hf_model, block_size=block_size, lora=lora)
    with stage("graph passes"):
        graph = ir.from_proto(proto)
        del proto
        pass_report = run_passes(graph, optional_passes)
        proto = ir.to_proto(graph)
        del graph
    return proto, pass_report


def lora_slots(options: ExportOptions) -> LoRASlots | None:
    """The adapter slots ``--enable-lora`` reserves, None without it."""
    if not options.enable_lora:
        return None
    return LoRASlots(options.max_loras, options.max_lora_rank, options.lora_targets)
