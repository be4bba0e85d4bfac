"""The ``sm*`` targets: TensorRT plans for one NVIDIA GPU architecture each (DESIGN §6, §11).

One ``SmTarget`` per row of ``SM_TABLE`` (arch, compute capability, FP8 and FP4 tensor cores);
a new GPU architecture is one row. A build writes a TensorRT plan (through the portable stage,
``llmc.engine.stage``) that TensorRT runs; dtypes bfloat16 (the default), float16, float32.
FP8 E4M3 needs sm89 or newer, FP4 E2M1 (NVFP4) sm100 or newer (DESIGN §5; TensorRT's support
matrix).

The plan's builder is the target's ``backend``: TensorRT for RTX ("tensorrt-rtx") for the
architectures it targets (``tensorrt_rtx.RTX_ARCHES``: sm86, sm89, sm120; its builder runs on a
CPU), TensorRT 11 ("tensorrt") for the rest. A host runs an sm engine when it has a GPU of the
plan's compute capability (any sm80+ GPU for a plan built with hardware compatibility
"ampere+") and exactly the major.minor.patch of the TensorRT (or TensorRT for RTX) that built
it: plans load only on the release that built them (TensorRT's "Version tag does not match").
Both are checked without importing either (``llmc.engine.gpu``, ``llmc.engine.tensorrt_rtx``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc.engine import tensorrt_rtx as rtx
from llmc.engine.gpu import GpuInfo, detect_gpus, missing_for_build, tensorrt_version
from llmc.engine.manifest import EngineManifest
from llmc.errors import EngineMismatchError

BACKEND = "tensorrt"
RTX_BACKEND = "tensorrt-rtx"
#: The backends of sm targets.
SM_BACKENDS = (BACKEND, RTX_BACKEND)

#: (arch, compute capability, FP8 tensor cores, FP4 tensor cores), oldest first.
SM_TABLE: tuple[tuple[str, tuple[int, int], bool, bool], ...] = (
    ("sm80", (8, 0), False, False),  # A100
    ("sm86", (8, 6), False, False),  # A10, A40, RTX 30
    ("sm89", (8, 9), True, False),  # L4, L40S, RTX 40
    ("sm90", (9, 0), True, False),  # H100, H200
    ("sm100", (10, 0), True, True),  # B200, GB200
    ("sm120", (12, 0), True, True),  # RTX 50, RTX PRO 6000 Blackwell
)


@dataclass(frozen=True)
class SmTarget:
    """One GPU architecture's target (module docstring); a ``llmc.engine.targets.Target``.

    Attributes:
        name: "sm" + major + minor of ``capability`` ("sm90").
        capability: the compute capability (major, minor) its plans are built for.
        fp8: the architecture has FP8 E4M3 tensor cores.
        fp4: the architecture has FP4 E2M1 tensor cores (NVFP4).
    """

    name: str
    capability: tuple[int, int]
    fp8: bool
    fp4: bool
    backend: str = BACKEND
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float32")
    default_dtype: str = "bfloat16"
    execution_providers: tuple[str, ...] = ()

    @property
    def sm(self) -> int:
        """The compute capability x 10, as kernel tables key it: 90 for sm90, 120 for sm120."""
        return self.capability[0] * 10 + self.capability[1]

    @property
    def capability_name(self) -> str:
        """The compute capability as NVIDIA writes it: "9.0"."""
        return "{}.{}".format(*self.capability)

    def check_runs_here(self, manifest: EngineManifest) -> None:
        """``check_gpu_host`` against this host's CUDA devices and installed TensorRT (or
        TensorRT for RTX: its bindings' version, and its libraries).

        Raises:
            EngineMismatchError: says what differs and what to run it on or install.
        """
        if self.backend == RTX_BACKEND:
            check_gpu_host(manifest, detect_gpus(), rtx.runtime_version())
        else:
            check_gpu_host(manifest, detect_gpus(), tensorrt_version())

    def missing_for_build(self) -> list[str]:
        """What this host lacks to build this target's plan: TensorRT for RTX's packages, or
        the ``tensorrt`` module and a GPU of this compute capability
        (``llmc.engine.gpu.missing_for_build``)."""
        if self.backend == RTX_BACKEND:
            return rtx.missing_for_build(self.name)
        return missing_for_build(self.name)


SM_TARGETS = tuple(
    SmTarget(*row, backend=RTX_BACKEND if row[0] in rtx.RTX_ARCHES else BACKEND) for row in SM_TABLE
)
_BY_NAME = {t.name: t for t in SM_TARGETS}


def check_gpu_host(
    manifest: EngineManifest, gpus: list[GpuInfo], trt_version: str | None
) -> GpuInfo:
    """Refuse a TensorRT engine this host cannot run, without importing ``tensorrt``.

    ``gpus``: this host's CUDA devices (``detect_gpus()``); ``trt_version``: the installed
    ``tensorrt`` package's version (None: not installed). Returns the GPU to run on.

    Raises:
        EngineMismatchError: the manifest's target is no GPU target; no CUDA GPU; no GPU the
            plan runs on (the builder GPU's compute capability, or any sm80+ for hardware
            compatibility "ampere+"); TensorRT missing or of another major.minor.patch than the
            plan was built with. The message says what to do.
    """
    trt = manifest.tensorrt or {}
    target = manifest.target
    cpu_build = f"`llmc build {manifest.source} --arch cpu`"
    sm = _BY_NAME.get(target)
    if sm is None:
        raise EngineMismatchError(
            f"engine target {target!r} is not a GPU target of this llmc "
            f"({', '.join(_BY_NAME)}); rebuild it with `llmc build {manifest.source} --arch ...`"
        )
    compat = trt.get("hardware_compatibility", "none")
    if not gpus:
        raise EngineMismatchError(
            f"engine built for {target} is a TensorRT plan that needs a GPU of compute capability "
            f"{sm.capability_name}; this host has no CUDA GPU. Run it on a {target} host, "
            f"or build a CPU engine with {cpu_build}"
        )
    fits = [
        g
        for g in gpus
        if g.capability == sm.capability or (compat == "ampere+" and g.capability >= (8, 0))
    ]
    if not fits:
        found = ", ".join(f"{g.name} ({g.arch})" for g in gpus)
        rebuild = f"`llmc build {manifest.source} --arch {gpus[0].arch}`"
        raise EngineMismatchError(
            f"engine built for {target} (hardware compatibility {compat}) does not run on this "
            f"host's GPUs: {found}; rebuild with {rebuild}"
        )
    built = manifest.backend_version
    needed = ".".join(release(built))
    if trt_version is None and manifest.backend == RTX_BACKEND:
        raise EngineMismatchError(
            f"engine is a TensorRT for RTX {built} plan but TensorRT for RTX is not installed "
            f"(its bindings and libraries); pip install {rtx.BINDINGS_DIST}=={needed}.* "
            f"{rtx.LIBRARIES_DIST}"
        )
    if trt_version is None:
        raise EngineMismatchError(
            f"engine is a TensorRT {built} plan but the tensorrt package is not installed; "
            f"pip install tensorrt=={needed}.*"
        )
    check_tensorrt_version(built, trt_version)
    return fits[0]


def release(version: str) -> tuple[str, ...]:
    """A TensorRT version's major.minor.patch ("11.1.0.7" -> ("11", "1", "0"))."""
    return tuple(version.split(".")[:3])


def check_tensorrt_version(built: str, installed: str) -> None:
    """Refuse running a plan built by TensorRT ``built`` with TensorRT ``installed`` unless
    their major.minor.patch agree: a plan loads only on the TensorRT that built it (DESIGN §6;
    TensorRT's "Version tag does not match"). Raises EngineMismatchError."""
    if release(installed) != release(built):
        needed = ".".join(release(built))
        raise EngineMismatchError(
            f"engine was built with TensorRT {built} but {installed} is installed; plans load "
            f"only on the TensorRT that built them: install tensorrt=={needed}.* or rebuild "
            "the engine with this TensorRT"
        )
