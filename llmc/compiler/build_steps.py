"""What the CPU and the GPU builds share (``build.py``, ``tensorrt/gpu_build.py``): the result
type, the unquantized graph, the tokenizer files, publishing, and the no-op progress stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

from llmc.calibration.accuracy import AccuracyReport
from llmc.compiler.build_config import BuildConfig
from llmc.compiler.export import export_onnx
from llmc.compiler.model_source import extra_eos_token_ids
from llmc.compiler.passes import run_passes
from llmc.registry.index import IndexEntry
from llmc.registry.local import LocalRegistry


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: where, the pass report, and the optimized graph's op counts."""

    engine_dir: Path
    pass_report: dict[str, int]
    optimized_ops: dict[str, int]
    quantization: dict | None = None
    accuracy_report: AccuracyReport | None = None
    registry_entry: IndexEntry | None = None  # with --registry


def save_tokenizer_and_generation_config(src, model, tokenizer, engine_dir: Path) -> list[int]:
    """Save the tokenizer (``tokenizer/``) and ``generation_config.json`` into ``engine_dir``,
    its ``eos_token_id`` every end-of-sequence id the model and tokenizer name; returns them."""
    tokenizer.save_pretrained(engine_dir / "tokenizer")
    gen = model.generation_config.to_dict() if model.generation_config is not None else {}
    eos = gen.get("eos_token_id", model.config.eos_token_id)
    eos = [*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id]
    eos += extra_eos_token_ids(src, tokenizer)
    eos_ids = sorted({int(e) for e in eos if e is not None})
    gen["eos_token_id"] = eos_ids
    (engine_dir / "generation_config.json").write_text(json.dumps(gen, indent=1, default=str))
    return eos_ids


def float_graph(model, block_size: int, stage=None) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The unquantized engine graph of a loaded HF model: export with plugin nodes, then the
    graph passes. Returns the graph and the pass report (rewrites per pass). This is also the
    reference the accuracy report and ``llmc verify`` compare an engine with."""
    import onnx_ir as ir

    stage = stage or no_stage
    with stage("export to ONNX"):
        proto = export_onnx(model, block_size=block_size)
    with stage("graph passes"):
        graph = ir.from_proto(proto)
        del proto
        pass_report = run_passes(graph)
        proto = ir.to_proto(graph)
        del graph
    return proto, pass_report


def publish(config: BuildConfig, engine_dir: Path, stage=None) -> IndexEntry | None:
    """With ``--registry PATH``, publish the built engine there (``LocalRegistry.publish``);
    returns its ``IndexEntry``, or None without ``--registry``."""
    if not config.registry:
        return None
    with (stage or no_stage)("publish to the registry"):
        return LocalRegistry(Path(config.registry)).publish(engine_dir)


class _NullStage:
    def __enter__(self):
        return lambda done, total: None

    def __exit__(self, *exc):
        return False


def no_stage(name: str) -> _NullStage:
    """A progress stage that reports nothing (``BuildProgress.stage`` without a display)."""
    return _NullStage()
