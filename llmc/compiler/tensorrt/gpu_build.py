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
from dataclasses import fields, replace
from pathlib import Path

from llmc.calibration.collect import load_stats, save_stats
from llmc.compiler.build_config import BuildConfig
from llmc.compiler.build_steps import (
    BuildResult,
    float_graph,
    no_stage,
    publish,
    save_tokenizer_and_generation_config,
)
from llmc.compiler.model_source import load_model, load_tokenizer, resolve_model, sha256_files
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.staged_dir import staged_dir
from llmc.compiler.tensorrt import lint
from llmc.compiler.tensorrt.builder import check_hardware_compat
from llmc.compiler.tensorrt.engine_dir import write_engine
from llmc.compiler.tensorrt.lower import lower_for_tensorrt
from llmc.engine import stage as st
from llmc.engine.gpu import missing_for_build
from llmc.engine.kv_cache import cache_spec
from llmc.engine.plugin import PLUGIN_ID, PLUGIN_VERSION
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
    host can (else raise TensorRTUnavailableError after writing the stage to ``config.output``
    or its default directory). Returns the ``BuildResult``."""

    config.validate()
    check_hardware_compat(config.hardware_compat)  # before the slow part, not after it
    missing = missing_for_build(config.arch)
    stage_dir = _prepare(config, progress, final=not missing)
    if missing:
        raise _unavailable(stage_dir, config.arch, missing)
    requested = {"output": config.output, "registry": config.registry}
    return finish_stage(stage_dir, requested, progress, remove_stage=True)


def _prepare(config: BuildConfig, progress, final: bool) -> Path:
    """Everything up to the stage; returns the stage directory: ``-o`` (else the default engine
    directory + ``-stage``) when the build stops there, else beside the engine (``.stage``)."""

    stage = progress.stage if progress is not None else no_stage
    with stage("resolve model"):
        src = resolve_model(config.model)
        tokenizer = load_tokenizer(src)
        checkpoint_digest = sha256_files(src.weight_files)
    if FORMATS[config.quant].quantizes:
        calib_source, _ = qp.text_sources(config)  # bad files fail before work
    with stage("load weights"):
        model = load_model(src, "float32")  # calibration runs the float32 graph on the CPU
    spec = cache_spec(model)
    proto, pass_report = float_graph(model, config.block_size, stage)
    quant_report = None
    if FORMATS[config.quant].quantizes:
        proto, quant_report = qp.quantize(
            config, proto, model, tokenizer, checkpoint_digest, calib_source, stage
        )
    with stage(f"lower to TensorRT ({config.dtype})"):
        lower_for_tensorrt(proto, config.dtype, config.kv_cache_dtype)
    with stage("TensorRT lint"):
        report = lint.lint_model(proto, config.arch)
        lint.raise_on_errors(report, "the lowered engine graph")
    out = config.output_dir(src.model_id)
    if final or config.output is None:
        out = out.with_name(out.name + (".stage" if final else "-stage"))
    with staged_dir(out) as tmp:
        with stage("portable stage"):
            save_tokenizer_and_generation_config(src, model, tokenizer, tmp)
            stats = None
            if quant_report is not None:
                key = quant_report.spec["calibration"]["cache_key"]
                cached = Path(config.cache_dir).expanduser() / "calibration" / f"{key}.npz"
                cached_stats = load_stats(cached)
                if cached_stats is not None:
                    # Without the Gram matrices (~0.5 GB for Gemma 3 270M): GPTQ used them, and
                    # its rounded weights are in the graph already.
                    kept = {k: replace(s, gram=None) for k, s in cached_stats.items()}
                    save_stats(kept, tmp / st.CALIBRATION_FILE)
                    stats = st.CALIBRATION_FILE
            kv = config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
            manifest = st.StageManifest(
                model_id=src.model_id,
                source=src.source,
                checkpoint_digest=checkpoint_digest,
                tokenizer_digest=sha256_files(sorted((tmp / "tokenizer").iterdir())),
                target=config.arch,
                dtype=config.dtype,
                quant=config.quant,
                kv_cache_dtype=kv,
                max_seq_len=config.max_seq_len,
                max_num_tokens=config.max_num_tokens,
                max_batch=config.max_batch,
                block_size=config.block_size,
                num_layers=spec.num_layers,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                vocab_size=int(model.config.vocab_size),
                plugin_versions={PLUGIN_ID: PLUGIN_VERSION},
                build_config={**config.to_dict(), "output": None, "registry": None},
                build_config_hash=config.hash(),
                pass_report=pass_report,
                quantization=quant_report.to_dict() if quant_report is not None else None,
                calibration_stats=stats,
                lint=report.to_dict(),
            )
            del model
            st.write_stage(proto, manifest, tmp)
    return out


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
    the command line), lint it, and build the engine. Raises StageError (damaged or mismatched
    stage), BuildConfigError (an option the stage fixes), TensorRTLintError,
    TensorRTUnavailableError (no TensorRT or GPU here), TensorRTBuildError."""

    stage = progress.stage if progress is not None else no_stage
    stage_dir = Path(stage_dir)
    fixed = sorted(k for k, v in requested.items() if k not in FINISH_OPTIONS and v is not None)
    if fixed:
        raise BuildConfigError(
            f"{', '.join('--' + k.replace('_', '-') for k in fixed)} cannot change when finishing "
            f"a stage (they shaped its graph); build a new stage instead"
        )
    with stage("check stage"):
        m = st.read_stage(stage_dir)
        st.check_request(m, requested)
        known = {f.name for f in fields(BuildConfig)}
        values = {k: v for k, v in m.build_config.items() if k in known}
        values.update({k: v for k, v in requested.items() if v is not None})
        values.setdefault("output", None)
        config = BuildConfig(**values)
        config.validate()
        check_hardware_compat(config.hardware_compat)
    with stage("TensorRT lint"):
        report = lint.lint_file(stage_dir / st.MODEL_FILE, m.target)
        lint.raise_on_errors(report, f"stage {stage_dir}")
    missing = missing_for_build(m.target)
    if missing:
        raise _unavailable(stage_dir, m.target, missing, written=False)

    out = write_engine(stage_dir, m, config, report, stage)
    if remove_stage:
        shutil.rmtree(stage_dir, ignore_errors=True)
    entry = publish(config, out, stage)
    return BuildResult(out, m.pass_report, report.op_counts, m.quantization, None, entry)
