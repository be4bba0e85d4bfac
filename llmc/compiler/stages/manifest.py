"""What every engine records about its build: ``core_facts``, the ``ManifestCore`` fields an
engine manifest and a portable TensorRT stage share (each backend adds its own)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmc.engine.plugin import PLUGIN_ID, PLUGIN_VERSION

if TYPE_CHECKING:
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.compiler.stages.load import LoadedModel
    from llmc.compiler.stages.quantize import EngineGraph


def core_facts(
    config: BuildConfig,
    model: LoadedModel,
    graph: EngineGraph,
    tokenizer_digest: str,
    quantization: dict | None,
) -> dict[str, Any]:
    """The ``ManifestCore`` fields of a build (every one but the format, llmc version, files
    and creation time), by name: the model and its digests, the target, dtypes and limits, the
    KV geometry, the plugin versions, the build config and its hash, the pass report,
    ``quantization`` (the report as the manifest records it, or None) and the LoRA slots."""
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
        lora=lora_record(config, graph),
    )


def lora_record(config: BuildConfig, graph: EngineGraph) -> dict | None:
    """The manifest's ``lora`` (``LoRALayout.to_dict``) of an engine graph built with
    ``--enable-lora``, read from its slot inputs; None without."""
    from llmc.engine.lora import layout_of_graph

    options = config.export
    if not options.enable_lora:
        return None
    inputs = [
        (i.name, [d.dim_value for d in i.type.tensor_type.shape.dim])
        for i in graph.proto.graph.input
    ]
    layout = layout_of_graph(options.max_loras, options.max_lora_rank, options.lora_targets, inputs)
    if layout is None:
        return None
    return layout.to_dict("float32" if config.target.is_cpu else str(config.source.dtype))
