"""Measure a lowered cpu engine: the execution provider that runs it fastest with agreeing
logits (``provider_choice``), then its accuracy on that provider against the float graph
(quantized and bf16 builds)."""

from __future__ import annotations

from pathlib import Path

from llmc.compiler.backends.onnxruntime.accuracy import accuracy_report
from llmc.compiler.backends.onnxruntime.provider_choice import ProviderSelection, select_provider
from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps
from llmc.compiler.backends.protocol import EngineReport, LoweredEngine
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.quantize import Reference
from llmc.engine.provider import HYBRID, ProviderChoice
from llmc.runtime.runners.hybrid_runner import MIN_OPENVINO_TOKENS


def chosen_provider(selection: ProviderSelection) -> ProviderChoice:
    """The provider ``selection`` chose, its compute precision and, for the hybrid, the step
    size from which it runs OpenVINO's runtime (recorded in the manifest)."""
    large = MIN_OPENVINO_TOKENS if selection.provider == HYBRID else None
    return ProviderChoice(selection.provider, selection.precision, large)


def report_cpu(
    engine: LoweredEngine,
    reference: Reference,
    config: BuildConfig,
    stage: Stage = no_stage,
    memory_allowed: int | None = None,
) -> EngineReport:
    """The provider choice, then the accuracy report of ``engine`` on the chosen provider
    against ``reference``'s float graph on its held-out windows (skipped when it has no texts):
    what is reported is what ships, bf16 compute included. Returns an ``EngineReport`` whose
    ``detail`` is the ``ProviderSelection``. Raises BuildConfigError when no provider is
    accepted. ``memory_allowed``: the bytes the measurement may add without raising the
    build's peak RSS (``provider_choice.select_provider``)."""
    model, texts = reference.model, reference.texts
    with stage("choose execution provider"):
        selection = choose_provider(config, engine.engine_dir, model.vocab_size, memory_allowed)
    accuracy = None
    if texts is not None:
        with stage("accuracy report") as tick:
            accuracy = accuracy_report(
                config,
                reference.graph.proto,
                engine.engine_dir,
                model.hf_model if reference.sampler is None else reference.sampler,
                model.tokenizer,
                texts.heldout,
                tick,
                external_data_dir=reference.graph.weights_dir,
                provider=chosen_provider(selection),
            )
    return EngineReport(accuracy, selection)


def choose_provider(
    config: BuildConfig, engine_dir: Path, vocab_size: int, memory_allowed: int | None = None
) -> ProviderSelection:
    """Measure the execution-provider candidates on the engine just lowered into
    ``engine_dir`` and choose one (``provider_choice.select_provider``)."""
    limits = config.export
    probe = probe_steps(
        limits.block_size, vocab_size, limits.max_seq_len, limits.max_num_tokens, limits.max_batch
    )
    return select_provider(
        engine_dir,
        config.source.dtype,
        _provider_mode(config),
        probe,
        config.target.threads,
        quantized=config.quantization.quantizes,
        memory_allowed=memory_allowed,
    )


def _provider_mode(config: BuildConfig) -> str:
    """``--execution-provider``; ``auto`` is the CPU EP for a LoRA engine (the runner that
    feeds the adapter slots, ``OrtRunner``)."""
    mode = config.target.execution_provider
    return "cpu" if mode == "auto" and config.export.enable_lora else mode
