"""``TargetOptions``: the hardware an engine is built for and its backend's build options."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.option import check_at_least, check_choices, option
from llmc.engine import targets as tg
from llmc.engine.targets.cpu import CPU
from llmc.engine.targets.sm import SM_BACKENDS
from llmc.errors import BuildConfigError

# The target axis is the registry's (llmc.engine.targets): a new target is a module there.
CPU_TARGET = CPU.name
GPU_TARGETS = tg.target_names(*SM_BACKENDS)
TARGETS = tg.target_names()
# TensorRT IBuilderConfig.hardware_compatibility_level and builder_optimization_level values.
HARDWARE_COMPAT = ("none", "ampere+", "same-cc")
BUILDER_OPT_LEVELS = range(0, 6)
EXECUTION_PROVIDERS = ("auto", *CPU.execution_providers)


@dataclass(frozen=True)
class TargetOptions:
    """The target: cpu (ONNX Runtime on this host's ISA) or a GPU arch (TensorRT), with the
    options of its backend."""

    arch: str = option(CPU_TARGET, "target: cpu (this host's ISA) or a GPU arch", TARGETS)
    threads: int = option(2, "CPU threads used to optimize and run the engine")
    execution_provider: str = option(
        "auto",
        "cpu engines: ONNX Runtime execution provider, OpenVINO's runtime, or the CPU EP for "
        "small steps and OpenVINO's runtime for large ones (cpu+openvino-runtime); auto "
        "measures every provider that runs here and keeps the fastest whose logits agree with "
        "the CPU EP's; a name forces one (still checked and timed)",
        EXECUTION_PROVIDERS,
    )
    max_build_memory: float | None = option(
        None,
        "GB of host memory the build may use: it plans its work to fit (weights streamed from "
        "the checkpoint, bounded tensors in flight) or refuses at once, naming what it needs",
    )
    timing_cache: str | None = option(
        None, "GPU targets: TensorRT timing cache file, read if it exists and written back"
    )
    builder_opt_level: int = option(
        3, "GPU targets: TensorRT builder optimization level 0-5 (higher: slower build)"
    )
    hardware_compat: str = option(
        "none",
        "GPU targets: TensorRT hardware compatibility: none (the builder's GPU only), ampere+ "
        "(any sm80+ GPU, slower), same-cc (GPUs of the builder's compute capability)",
        HARDWARE_COMPAT,
    )

    @property
    def is_cpu(self) -> bool:
        """Whether this is the cpu target (an ONNX Runtime engine for this host's ISA)."""
        known = tg.TARGETS.get(self.arch)
        return known is not None and known.backend == "onnxruntime"

    def validate(self) -> None:
        """Raise BuildConfigError for an unknown target or provider, fewer than 1 thread, a
        builder level outside TensorRT's 0-5, or a provider asked of a GPU target."""
        check_choices(self)
        check_at_least(self, 1, "threads")
        if self.max_build_memory is not None and self.max_build_memory <= 0:
            raise BuildConfigError(
                f"--max-build-memory must be > 0 GB, got {self.max_build_memory}"
            )
        if self.builder_opt_level not in BUILDER_OPT_LEVELS:
            raise BuildConfigError(
                f"--builder-opt-level must be 0-5 (TensorRT's range), got {self.builder_opt_level}"
            )
        if self.execution_provider != "auto" and not self.is_cpu:
            raise BuildConfigError(
                f"--execution-provider {self.execution_provider} applies to cpu engines; "
                f"{self.arch} engines run on TensorRT"
            )
