"""Write what an engine records about its build: ``core_facts`` (the ``ManifestCore`` fields an
engine manifest and a portable TensorRT stage share), and the cpu engine's ``manifest.json``."""

from __future__ import annotations

from typing import Any

from llmc.compiler.backends.onnxruntime.host import CpuPlan
from llmc.compiler.backends.onnxruntime.lower_stage import LoweredEngine
from llmc.compiler.backends.onnxruntime.report import EngineReport
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.plan import MemoryPlan
from llmc.compiler.stages.build_stats import BuildStats
from llmc.compiler.stages.load import LoadedModel
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.quantize import EngineGraph
from llmc.compiler.stages.tokenizer import write_tokenizer_files
from llmc.engine import manifest as mf
from llmc.engine.plugin import PLUGIN_ID, PLUGIN_VERSION
from llmc.engine.provider import provider_version


def core_facts(
    config: BuildConfig,
    model: LoadedModel,
    graph: EngineGraph,
    tokenizer_digest: str,
    quantization: dict | None,
) -> dict[str, Any]:
    """The ``ManifestCore`` fields of a build (every one but the format, llmc version, files
    and creation time), by name: the model and its digests, the target, dtypes and limits, the
    KV geometry, the plugin versions, the build config and its hash, the pass report and
    ``quantization`` (the report as the manifest records it, or None)."""
    resolved = model.resolved
    limits = config.export
    return dict(
        model_id=resolved.model_id,
        source=resolved.source.source,
        checkpoint_digest=resolved.checkpoint_digest,
        tokenizer_digest=tokenizer_digest,
        target=config.target.arch,
        dtype=config.source.dtype,
        quant=config.quantization.quant,
        kv_cache_dtype=config.kv_cache_storage,
        max_seq_len=limits.max_seq_len,
        max_num_tokens=limits.max_num_tokens,
        max_batch=limits.max_batch,
        block_size=limits.block_size,
        num_layers=model.cache.num_layers,
        num_kv_heads=model.cache.num_kv_heads,
        head_dim=model.cache.head_dim,
        vocab_size=model.vocab_size,
        plugin_versions={PLUGIN_ID: PLUGIN_VERSION},
        build_config=config.to_dict(),
        build_config_hash=config.hash(),
        pass_report=graph.pass_report,
        quantization=quantization,
    )


def write_cpu_manifest(
    config: BuildConfig,
    model: LoadedModel,
    graph: EngineGraph,
    engine: LoweredEngine,
    report: EngineReport,
    plan: CpuPlan,
    stage: Stage = no_stage,
    stats: BuildStats | None = None,
    memory: MemoryPlan | None = None,
) -> mf.EngineManifest:
    """Write the tokenizer files and ``manifest.json`` of a lowered cpu engine (the last
    files: the manifest lists every other file's digest); returns the manifest. ``stats``
    (stages so far) and ``memory`` (the build's memory plan) become ``build_stats``."""
    import onnxruntime as ort

    with stage("tokenizer and manifest"):
        tokenizer_digest = write_tokenizer_files(
            model.tokenizer, model.generation, engine.engine_dir
        )
        provider = report.provider
        manifest = mf.EngineManifest(
            **core_facts(config, model, graph, tokenizer_digest, engine.quantization),
            isa=plan.isa,
            arch=plan.arch,
            backend="onnxruntime",
            backend_version=ort.__version__,
            execution_provider=provider.name,
            execution_precision=provider.precision,
            execution_provider_version=provider_version(provider),
            execution_min_large_tokens=provider.min_large_tokens,
            provider_selection=report.selection.to_dict(),
            accuracy_report=report.accuracy.to_dict() if report.accuracy is not None else None,
            files=mf.file_digests(engine.engine_dir),
            build_stats=_build_stats(stats, memory),
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
