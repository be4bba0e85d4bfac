"""The two TensorRT builders a GPU target's plan comes from, chosen by the target.

- **TensorRT for RTX 1.7** (``rtx/``) for sm86, sm89 and sm120 (the targets whose backend is
  "tensorrt-rtx", ``llmc.engine.targets.sm``): its builder runs on any host,
  GPU or not (the plan's kernels are compiled on the user's GPU when it first loads the plan), so
  ``llmc build --arch sm89`` writes a real engine in CI.
- **TensorRT 11** for the rest (sm80, sm90, sm100): TensorRT for RTX does not target Hopper or
  data-center Blackwell, and TensorRT 11 builds only on a GPU of the target's compute capability;
  elsewhere the build stops after the portable stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmc.compiler.backends.tensorrt.builder import PlanRequest, build_plan
from llmc.compiler.backends.tensorrt.rtx.plan_build import build_plan_rtx
from llmc.compiler.config.target import TargetOptions
from llmc.engine import gpu
from llmc.engine import tensorrt_rtx as rtx
from llmc.engine.targets import TARGETS


@dataclass(frozen=True)
class PlanFlavour:
    """One TensorRT builder.

    Attributes:
        backend: the manifest's ``backend`` and the backends registry's key.
        builder: the builder's name as messages and the manifest say it.
        why: why it builds the targets it builds (the CLI prints it).
        finish_host: where a stage this host cannot finish is finished.
        missing: ``missing(arch)``: what this host lacks to build a plan for ``arch``.
        build: ``build(request, target, tick)``: build the plan, return the manifest's
            ``tensorrt`` record (raises TensorRTBuildError).
    """

    backend: str
    builder: str
    why: str
    finish_host: str
    missing: Callable[[str], list[str]]
    build: Callable[[PlanRequest, TargetOptions, object], dict]


def _build_tensorrt(request: PlanRequest, target: TargetOptions, tick) -> dict:
    """TensorRT 11, on this host's GPU of the target's compute capability."""
    import torch  # its CUDA version is recorded, and this path runs only on a GPU host

    record = build_plan(
        request.onnx_path,
        request.plan_path,
        request.profile,
        builder_opt_level=request.builder_opt_level,
        hardware_compat=target.hardware_compat,
        timing_cache=request.timing_cache,
        tick=tick,
    )
    wanted = gpu.arch_capability(target.arch)
    builder_gpu = next(g for g in gpu.detect_gpus() if g.capability == wanted)
    return record | {
        "builder": "TensorRT",
        "cuda_version": torch.version.cuda,
        "compute_capability": gpu.capability_name(target.arch),
        "builder_gpu": builder_gpu.name,
    }


def _build_rtx(request: PlanRequest, target: TargetOptions, tick) -> dict:
    """TensorRT for RTX, on this host's CPU."""
    record = build_plan_rtx(request, target.arch, tick)
    return record | {
        "builder": "TensorRT-RTX",
        "compute_capability": gpu.capability_name(target.arch),
        "built_on": "cpu",
        "kernels": "built on CPU, kernels compiled on the GPU at first load",
        "plugin_implementation": "IPluginV3 (IPluginCreatorV3One, namespace llmc)",
    }


TENSORRT = PlanFlavour(
    backend="tensorrt",
    builder="TensorRT 11",
    why="a data-center GPU: TensorRT 11, which builds on a GPU of the target",
    finish_host="a GPU builder",
    missing=gpu.missing_for_build,
    build=_build_tensorrt,
)
TENSORRT_RTX = PlanFlavour(
    backend="tensorrt-rtx",
    builder="TensorRT for RTX",
    why=f"TensorRT for RTX targets {', '.join(rtx.RTX_ARCHES)} and its builder runs on a CPU",
    finish_host=f"a host with TensorRT for RTX ({rtx.EXTRA})",
    missing=rtx.missing_for_build,
    build=_build_rtx,
)


def flavour_for(arch: str) -> PlanFlavour:
    """The builder of GPU target ``arch`` (its target's backend; TensorRT 11 for an arch this
    llmc does not know, which the build refuses)."""
    known = TARGETS.get(arch)
    return TENSORRT_RTX if known is not None and known.backend == TENSORRT_RTX.backend else TENSORRT
