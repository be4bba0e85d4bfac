"""Whether this host runs an engine: ``check_runs_here``, before anything of it is loaded.

A CPU engine needs this machine's architecture, the ISA features it was built for (executed,
``llmc.engine.isa``), the ONNX Runtime major.minor that built it and its execution provider's
plugin major.minor. A TensorRT engine needs a GPU it runs on and exactly the TensorRT release
that built it (``llmc.engine.gpu``; checked without importing ``tensorrt``). Each refusal says
what to rebuild or install. The registry's resolver runs the same check on every candidate.
"""

from __future__ import annotations

import re

from llmc.engine.gpu import GpuInfo, arch_capability, capability_name, detect_gpus
from llmc.engine.gpu import tensorrt_version as installed_tensorrt_version
from llmc.engine.isa import HostIsa, detect_host_isa, isa_name, missing_features
from llmc.engine.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    EngineManifest,
    raise_format_mismatch,
    rebuild_command,
)
from llmc.engine.provider import ProviderChoice, provider_version
from llmc.errors import EngineMismatchError

GPU_TARGET = re.compile(r"sm\d+")


def check_runs_here(manifest: EngineManifest) -> None:
    """Refuse an engine this host cannot run: for a TensorRT plan its GPU and TensorRT
    (``check_gpu_host``); otherwise target, machine, ISA features, ONNX Runtime major.minor
    (``check_host``), then the execution provider plugin's version. Deserializes nothing.

    Raises:
        EngineMismatchError: says what differs and what to rebuild or install.
    """
    if manifest.backend == "tensorrt":
        check_gpu_host(manifest, detect_gpus(), installed_tensorrt_version())
        return
    import onnxruntime as ort  # here: its import costs ~0.2 s that a GPU engine never needs

    check_host(manifest, detect_host_isa(), {"onnxruntime": ort.__version__})
    provider = ProviderChoice(manifest.execution_provider, manifest.execution_precision)
    check_provider_version(manifest, provider_version(provider))


def check_host(m: EngineManifest, host: HostIsa, backend_versions: dict[str, str]) -> None:
    """Refuse a CPU engine this host cannot run, before anything of it is loaded.

    ``backend_versions`` maps backend name ("onnxruntime", "tensorrt") to its installed version;
    a backend absent from it counts as not installed. This host is assumed to have no GPU.

    Raises:
        EngineMismatchError: format version, target (a GPU arch), machine arch, ISA features or
            the backend's major.minor version differ; the message says what to rebuild or install.
    """
    if m.format_version != FORMAT_VERSION:
        raise_format_mismatch(m.format_version, MANIFEST_NAME)
    rebuild = rebuild_command(m, "cpu")
    if GPU_TARGET.fullmatch(m.target):
        raise EngineMismatchError(
            f"engine built for {m.target}, this host is {host.name} (no GPU); "
            f"rebuild with {rebuild}"
        )
    if m.target != "cpu":
        raise EngineMismatchError(f"unknown engine target {m.target!r}; rebuild with {rebuild}")
    if m.arch != host.arch:
        raise EngineMismatchError(
            f"engine built for {m.arch}, this host is {host.arch} ({host.name}); "
            f"rebuild on this host with {rebuild}"
        )
    missing = missing_features(m.isa, host)
    if missing:
        raise EngineMismatchError(
            f"engine built for {isa_name(m.isa)} needs {', '.join(missing)}, which this host "
            f"({host.name}) does not run; rebuild on this host with {rebuild}"
        )
    installed = backend_versions.get(m.backend)
    needed = ".".join(m.backend_version.split(".")[:2])
    if installed is None:
        raise EngineMismatchError(
            f"engine needs {m.backend} {needed}.x (built with {m.backend_version}), which is not "
            f"installed; install {m.backend} {needed}.x"
        )
    if _major_minor(installed) != _major_minor(m.backend_version):
        raise EngineMismatchError(
            f"engine was built with {m.backend} {m.backend_version} but {installed} is installed; "
            f"install {m.backend} {needed}.x or rebuild with {rebuild}"
        )


def check_provider_version(manifest: EngineManifest, installed: str | None) -> None:
    """Refuse an engine built with another major.minor of its execution-provider plugin
    (``installed``: the plugin package's version here, None when it is not installed)."""
    needed = manifest.execution_provider_version
    if needed is None:
        return
    if installed is None or installed.split(".")[:2] != needed.split(".")[:2]:
        raise EngineMismatchError(
            f"engine runs on {manifest.execution_provider} {needed} but "
            f"{installed or 'no version'} is installed; pip install the matching "
            "onnxruntime-ep-openvino, or rebuild the engine with --dtype float32"
        )


def check_gpu_host(
    manifest: EngineManifest, gpus: list[GpuInfo], trt_version: str | None
) -> GpuInfo:
    """Refuse a TensorRT engine this host cannot run, without importing ``tensorrt``.

    ``gpus``: this host's CUDA devices (``detect_gpus()``); ``trt_version``: the installed
    ``tensorrt`` package's version (None: not installed). Returns the GPU to run on.

    Raises:
        EngineMismatchError: no CUDA GPU; no GPU the plan runs on (the builder GPU's compute
            capability, or any sm80+ for hardware compatibility "ampere+"); TensorRT missing or
            of another major.minor.patch than the plan was built with. The message says what
            to do.
    """
    trt = manifest.tensorrt or {}
    target = manifest.target
    wanted = arch_capability(target)
    compat = trt.get("hardware_compatibility", "none")
    cpu_build = f"`llmc build {manifest.source} --arch cpu`"
    if not gpus:
        raise EngineMismatchError(
            f"engine built for {target} is a TensorRT plan that needs a GPU of compute capability "
            f"{capability_name(target)}; this host has no CUDA GPU. Run it on a {target} host, "
            f"or build a CPU engine with {cpu_build}"
        )
    fits = [
        g
        for g in gpus
        if g.capability == wanted or (compat == "ampere+" and g.capability >= (8, 0))
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


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(re.split(r"[.+-]", version)[:2])
