"""``llmc build --arch sm*``: checkpoint -> portable stage -> TensorRT engine directory.

Two halves (DESIGN §6). ``build_gpu`` runs everywhere: export, passes, calibration and Q/DQ (the
same code as the CPU path), ``lower_for_tensorrt``, the TensorRT lint, then the portable stage.
``finish_stage`` needs TensorRT and a GPU of the target's compute capability: it re-lints the
stage, builds the plan (``builder.build_plan``) and writes the engine directory (plan, manifest,
tokenizer). Without them, the build stops after the stage with ``TensorRTUnavailableError``
(exit code 2) naming what is missing and the ``--from`` command that finishes it.

The second half has never run: no machine of ours has TensorRT or a GPU.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import replace
from pathlib import Path

from llmc.calibration.stats_cache import StatsCache, save_stats
from llmc.compiler.build_config import BuildConfig, flatten_options
from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.config.destination import DestinationOptions
from llmc.compiler.memory_plan import plan_memory
from llmc.compiler.quantize.qdq import QuantReport
from llmc.compiler.staged_dir import staged_dir
from llmc.compiler.stages.export import export
from llmc.compiler.stages.load import load, resolve
from llmc.compiler.stages.manifest import core_facts
from llmc.compiler.stages.progress import Stage, stage_of
from llmc.compiler.stages.publish import publish_result
from llmc.compiler.stages.quantize import EngineGraph, quantize, read_texts
from llmc.compiler.stages.result import BuildResult
from llmc.compiler.stages.tokenizer import write_tokenizer_files
from llmc.compiler.tensorrt import lint
from llmc.compiler.tensorrt.builder import check_hardware_compat
from llmc.compiler.tensorrt.engine_dir import write_engine
from llmc.compiler.tensorrt.lower import lower_for_tensorrt
from llmc.engine import stage as st
from llmc.engine.gpu import missing_for_build
from llmc.errors import BuildConfigError, LlmcError

#: Options ``--from`` may set: the target (must match), serving limits (they only shape the
#: optimization profile) and TensorRT builder options. The rest is fixed by the stage.
FINISH_OPTIONS = {
    "arch",
    "quant",
    "dtype",
    "kv_cache_dtype",
    "max_seq_len",
    "max_num_tokens",
    "max_batch",
    "timing_cache",
    "builder_opt_level",
    "hardware_compat",
    "output",
    "registry",
    "threads",
}


class TensorRTUnavailableError(LlmcError):
    """The portable stage is written, but this host cannot build the TensorRT plan."""


def build_gpu(config: BuildConfig, progress=None) -> BuildResult:
    """Build ``config`` (a GPU target) up to the portable stage, then finish it here if this
    host can (else raise TensorRTUnavailableError after writing the stage to ``--output`` or
    its default directory). Returns the ``BuildResult``."""

    config.validate()
    check_hardware_compat(config.target.hardware_compat)  # before the slow part, not after it
    missing = missing_for_build(config.target.arch)
    stage_dir = _prepare(config, progress, final=not missing)
    if missing:
        raise _unavailable(stage_dir, config.target.arch, missing)
    requested = {"output": config.destination.output, "registry": config.destination.registry}
    return finish_stage(stage_dir, requested, progress, remove_stage=True)


def _prepare(config: BuildConfig, progress, final: bool) -> Path:
    """Everything up to the stage; returns the stage directory: ``-o`` (else the default engine
    directory + ``-stage``) when the build stops there, else beside the engine (``.stage``)."""

    stage = stage_of(progress)
    resolved = resolve(config.source, stage)
    texts = read_texts(config)  # bad files fail before work
    # GPU stages load the model whole: refuse at once what --max-build-memory cannot hold.
    limit = config.target.max_build_memory
    plan_memory(resolved.source, config.quantization.quant, cpu=False, limit_gb=limit)
    model = load(resolved, stage)  # calibration runs the float32 graph on the CPU
    graph = quantize(export(model, config.export, stage), model, config, texts, stage)
    lint_report = lower_tensorrt(graph, config, stage)
    out = config.output_dir(resolved.model_id)
    if final or config.destination.output is None:
        out = out.with_name(out.name + (".stage" if final else "-stage"))
    with staged_dir(out) as tmp:
        with stage("portable stage"):
            tokenizer_digest = write_tokenizer_files(model.tokenizer, model.generation, tmp)
            report = graph.quant_report
            manifest = st.StageManifest(
                # The engine's destination is chosen when the stage is finished.
                **core_facts(
                    replace(config, destination=DestinationOptions()),
                    model,
                    graph,
                    tokenizer_digest,
                    report.to_dict() if report is not None else None,
                ),
                calibration_stats=_copy_calibration_stats(report, config.calibration, tmp),
                lint=lint_report.to_dict(),
            )
            del model
            st.write_stage(graph.proto, manifest, tmp)
    return out


def lower_tensorrt(graph: EngineGraph, config: BuildConfig, stage: Stage) -> lint.LintReport:
    """Lower ``graph`` in place to what TensorRT's parser takes in ``config``'s dtype and KV
    cache dtype (``lower_for_tensorrt``) and lint it for the target. Returns the lint report;
    raises TensorRTLintError when it finds errors."""
    dtype = config.source.dtype
    with stage(f"lower to TensorRT ({dtype})"):
        lower_for_tensorrt(graph.proto, dtype, config.quantization.kv_cache_dtype)
    with stage("TensorRT lint"):
        report = lint.lint_model(graph.proto, config.target.arch)
        lint.raise_on_errors(report, "the lowered engine graph")
    return report


def _copy_calibration_stats(
    report: QuantReport | None, calibration: CalibrationOptions, stage_dir: Path
) -> str | None:
    """Copy the cached calibration statistics a quantized graph was built with into the stage;
    returns their path in it, or None (unquantized, or no longer cached)."""
    if report is None:
        return None
    cache = StatsCache(calibration.stats_path(report.spec["calibration"]["cache_key"]))
    # Without the Gram matrices (~0.5 GB for Gemma 3 270M): GPTQ used them, and its rounded
    # weights are in the graph already.
    cached = cache.load_all(gram=False)
    if cached is None:
        return None
    save_stats(cached, stage_dir / st.CALIBRATION_FILE)
    return st.CALIBRATION_FILE


def _unavailable(
    stage_dir: Path, arch: str, missing: list[str], written: bool = True
) -> TensorRTUnavailableError:
    finish = shlex.join(["llmc", "build", "--from", str(stage_dir), "--arch", arch])
    done = "portable stage written to" if written else "portable stage"
    return TensorRTUnavailableError(
        f"{done} {stage_dir} (TensorRT lint passed), but this host cannot "
        f"build the TensorRT plan for {arch}: missing {' and '.join(missing)}. Finish it on a "
        f"GPU builder with: {finish}"
    )


def finish_stage(
    stage_dir: str | Path, requested: dict, progress=None, remove_stage: bool = False
) -> BuildResult:
    """``llmc build --from STAGE``: check the stage against ``requested`` (the options given on
    the command line, by flat name), lint it, and build the engine. Raises StageError (damaged
    or mismatched stage), BuildConfigError (an option the stage fixes), TensorRTLintError,
    TensorRTUnavailableError (no TensorRT or GPU here), TensorRTBuildError."""

    stage = stage_of(progress)
    stage_dir = Path(stage_dir)
    fixed = sorted(k for k, v in requested.items() if k not in FINISH_OPTIONS and v is not None)
    if fixed:
        raise BuildConfigError(
            f"{', '.join('--' + k.replace('_', '-') for k in fixed)} cannot change when finishing "
            f"a stage (they shaped its graph); build a new stage instead"
        )
    with stage("check stage"):
        m = st.read_stage(stage_dir)
        recorded = flatten_options(m.build_config, str(stage_dir), ignore_unknown=True)
        # ``check_request`` reads the recorded options by their flat names.
        st.check_request(replace(m, build_config=recorded), requested)
        config = BuildConfig.of(
            **(recorded | {k: v for k, v in requested.items() if v is not None})
        )
        config.validate()
        check_hardware_compat(config.target.hardware_compat)
    with stage("TensorRT lint"):
        report = lint.lint_file(stage_dir / st.MODEL_FILE, m.target)
        lint.raise_on_errors(report, f"stage {stage_dir}")
    missing = missing_for_build(m.target)
    if missing:
        raise _unavailable(stage_dir, m.target, missing, written=False)

    out = write_engine(stage_dir, m, config, report, stage)
    if remove_stage:
        shutil.rmtree(stage_dir, ignore_errors=True)
    return publish_result(
        config.destination, out, stage, m.pass_report, report.op_counts, m.quantization
    )
