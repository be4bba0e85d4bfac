"""Measure a lowered cpu engine: the execution provider that runs it fastest with agreeing
logits (``provider_choice``), then its accuracy on that provider against the float graph
(quantized and bf16 builds)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmc.calibration.accuracy import AccuracyReport
from llmc.compiler.backends.onnxruntime.lower_stage import LoweredEngine
from llmc.compiler.backends.onnxruntime.provider_choice import ProviderSelection, select_provider
from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.stages.export import FloatGraph
from llmc.compiler.stages.load import LoadedModel
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.quantize import CalibrationTexts
from llmc.engine.provider import HYBRID, ProviderChoice
from llmc.runtime.hybrid_runner import MIN_OPENVINO_TOKENS


@dataclass(frozen=True)
class EngineReport:
    """What was measured on a lowered cpu engine: ``accuracy`` against the float graph on
    held-out text (None unless quantized) and the provider ``selection``."""

    accuracy: AccuracyReport | None
    selection: ProviderSelection

    @property
    def provider(self) -> ProviderChoice:
        """The chosen execution provider (``chosen_provider``)."""
        return chosen_provider(self.selection)


def chosen_provider(selection: ProviderSelection) -> ProviderChoice:
    """The provider ``selection`` chose, its compute precision and, for the hybrid, the step
    size from which it runs OpenVINO's runtime (recorded in the manifest)."""
    large = MIN_OPENVINO_TOKENS if selection.provider == HYBRID else None
    return ProviderChoice(selection.provider, selection.precision, large)


def report_cpu(
    engine: LoweredEngine,
    reference: FloatGraph,
    model: LoadedModel,
    config: BuildConfig,
    texts: CalibrationTexts | None,
    stage: Stage = no_stage,
    sampler: Any = None,
    memory_allowed: int | None = None,
) -> EngineReport:
    """The provider choice, then the accuracy report of ``engine`` on the chosen provider
    against ``reference`` on ``texts``' held-out windows (skipped when ``texts`` is None): what
    is reported is what ships, bf16 compute included. Raises BuildConfigError when no provider
    is accepted. ``memory_allowed``: the bytes the measurement may add without raising the build's
    peak RSS (``provider_choice.select_provider``)."""
    with stage("choose execution provider"):
        selection = choose_provider(config, engine.engine_dir, model.vocab_size, memory_allowed)
    provider = chosen_provider(selection)
    accuracy = None
    if texts is not None:
        with stage("accuracy report") as tick:
            accuracy = qp.accuracy_report(
                config,
                reference.proto,
                engine.engine_dir,
                model.hf_model if sampler is None else sampler,
                model.tokenizer,
                texts.heldout,
                tick,
                external_data_dir=reference.weights_dir,
                provider=provider,
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
        config.target.execution_provider,
        probe,
        config.target.threads,
        quantized=config.quantization.quantizes,
        memory_allowed=memory_allowed,
    )
