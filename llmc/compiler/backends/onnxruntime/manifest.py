"""The cpu engine's ``manifest.json``: the facts every engine records (``core_facts``), then
the host's ISA, the execution provider chosen and its selection, the accuracy report and the
build's stages and memory plan."""

from __future__ import annotations

from llmc.compiler.backends.onnxruntime.report import chosen_provider
from llmc.compiler.backends.protocol import BuildRecord
from llmc.compiler.memory.plan import MemoryPlan
from llmc.compiler.stages.build_stats import BuildStats
from llmc.compiler.stages.manifest import core_facts
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.tokenizer import write_tokenizer_files
from llmc.engine import manifest as mf
from llmc.engine.provider import provider_version


def write_cpu_manifest(record: BuildRecord, stage: Stage = no_stage) -> mf.EngineManifest:
    """Write the tokenizer files and ``manifest.json`` of a lowered cpu engine (the last
    files: the manifest lists every other file's digest); returns the manifest. The record's
    ``stats`` (stages so far) and ``memory`` (the build's memory plan) become ``build_stats``;
    its host plan's ``detail`` is the ``CpuPlan`` and its report's the provider selection."""
    import onnxruntime as ort

    model, engine, report, plan = record.model, record.engine, record.report, record.host.detail
    with stage("tokenizer and manifest"):
        tokenizer_digest = write_tokenizer_files(
            model.tokenizer, model.generation, engine.engine_dir
        )
        provider = chosen_provider(report.detail)
        facts = core_facts(
            record.config, model, record.graph, tokenizer_digest, engine.quantization
        )
        manifest = mf.EngineManifest(
            **facts,
            isa=plan.isa,
            arch=plan.arch,
            backend="onnxruntime",
            backend_version=ort.__version__,
            execution_provider=provider.name,
            execution_precision=provider.precision,
            execution_provider_version=provider_version(provider),
            execution_min_large_tokens=provider.min_large_tokens,
            provider_selection=report.detail.to_dict(),
            accuracy_report=report.accuracy.to_dict() if report.accuracy is not None else None,
            files=mf.file_digests(engine.engine_dir),
            build_stats=_build_stats(record.stats, record.memory),
        )
        mf.write_manifest(manifest, engine.engine_dir)
    return manifest


def _build_stats(stats: BuildStats | None, memory: MemoryPlan | None) -> dict | None:
    """The manifest's ``build_stats``: the stages measured so far (the manifest is the last
    file written, so its own stage is not among them) and the memory plan."""
    if stats is None:
        return None
    d = stats.to_dict()
    if memory is not None:
        d["memory_plan"] = memory.to_dict()
    return d
