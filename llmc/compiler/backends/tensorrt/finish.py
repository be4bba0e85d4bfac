"""Finish a portable stage into a TensorRT engine directory: ``llmc build --from STAGE``.

The stage is what ``llmc build --arch sm*`` writes anywhere (``backend.TensorRTBackend``: export,
passes, calibration and Q/DQ as every backend, then the TensorRT lowering and lint). Finishing
needs TensorRT and a GPU of the target's compute capability: it re-lints the stage, builds the
plan (``builder.build_plan``) and writes the engine directory (plan, manifest, tokenizer).
Without them, a build stops after the stage with ``TensorRTUnavailableError`` (exit code 2)
naming what is missing and the ``--from`` command that finishes it.

The second half has never run: no machine of ours has TensorRT or a GPU.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from llmc.compiler.backends.tensorrt import lint
from llmc.compiler.backends.tensorrt.builder import check_hardware_compat
from llmc.compiler.backends.tensorrt.engine_dir import write_engine
from llmc.compiler.backends.tensorrt.flavour import flavour_for
from llmc.compiler.config.build_config import BuildConfig, flatten_options
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.publish import publish_result
from llmc.compiler.stages.result import BuildResult
from llmc.engine import stage as st
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


def unavailable(
    stage_dir: Path, arch: str, missing: list[str], written: bool = True
) -> TensorRTUnavailableError:
    """The TensorRTUnavailableError of a stage at ``stage_dir`` (``written``: just written by
    this build) that this host cannot finish for ``arch``, lacking ``missing``: it names the
    ``llmc build --from`` command that finishes it on a GPU builder."""
    finish = shlex.join(["llmc", "build", "--from", str(stage_dir), "--arch", arch])
    done = "portable stage written to" if written else "portable stage"
    flavour = flavour_for(arch)
    return TensorRTUnavailableError(
        f"{done} {stage_dir} (TensorRT lint passed), but this host cannot "
        f"build the {flavour.builder} plan for {arch}: missing {' and '.join(missing)}. "
        f"Finish it on {flavour.finish_host} with: {finish}"
    )


def finish_stage(stage_dir: str | Path, requested: dict, stage: Stage = no_stage) -> BuildResult:
    """``llmc build --from STAGE``: check the stage against ``requested`` (the options given on
    the command line, by flat name), lint it, and build the engine. Raises StageError (damaged
    or mismatched stage), BuildConfigError (an option the stage fixes), TensorRTLintError,
    TensorRTUnavailableError (no TensorRT or GPU here), TensorRTBuildError."""

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
    missing = flavour_for(m.target).missing(m.target)
    if missing:
        raise unavailable(stage_dir, m.target, missing, written=False)

    out = write_engine(stage_dir, m, config, report, stage)
    return publish_result(
        config.destination, out, stage, m.pass_report, report.op_counts, m.quantization
    )
