"""The ``cpu`` target: an ONNX Runtime engine for this host's ISA (DESIGN §6, §10).

A cpu build writes an ONNX Runtime engine: the graph optimized for the ISA features of the host
that built it (recorded in the manifest's ``isa``, detected by executing them,
``llmc.engine.isa``) and run by ONNX Runtime. Its dtypes are float32 (the default) and bfloat16.

Execution providers are a sub-axis of this target, not targets of their own: the same engine
graph runs on ONNX Runtime's CPU EP (float32) or its OpenVINO EP (bfloat16 compute on AVX-512
BF16 hosts), chosen at build time by measurement and recorded in the manifest
(``llmc.engine.provider``). A new provider is an entry of ``PROVIDERS``; a new target is a new
backend or a new kind of hardware.

A host runs a cpu engine when its machine architecture and executed ISA features cover the
engine's, its ONNX Runtime has the major.minor that built the engine, and the execution
provider's plugin package has the major.minor the engine was built with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.util import find_spec

from llmc.engine.isa import HostIsa, detect_host_isa, isa_name, missing_features
from llmc.engine.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    EngineManifest,
    raise_format_mismatch,
    rebuild_command,
)
from llmc.engine.provider import (
    HYBRID,
    PROVIDER_PACKAGES,
    PROVIDERS,
    onnxruntime_version,
    provider_version,
)
from llmc.errors import EngineMismatchError

BACKEND = "onnxruntime"


@dataclass(frozen=True)
class CpuTarget:
    """The ``cpu`` target (module docstring); a ``llmc.engine.targets.Target``."""

    name: str = "cpu"
    backend: str = BACKEND
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    default_dtype: str = "float32"
    execution_providers: tuple[str, ...] = tuple(PROVIDERS)
    capability: tuple[int, int] | None = None

    def check_runs_here(self, manifest: EngineManifest) -> None:
        """``check_host`` against this host's executed ISA and installed ONNX Runtime, then
        ``check_provider_version`` against the installed execution-provider plugin.

        Raises:
            EngineMismatchError: says what differs and what to rebuild or install.
        """
        installed = onnxruntime_version()
        check_host(manifest, detect_host_isa(), {BACKEND: installed} if installed else {})
        provider = manifest.provider
        check_provider_version(manifest, provider_version(provider))

    def missing_for_build(self) -> list[str]:
        """[] when ONNX Runtime is installed, else the phrase that says to install it."""
        if find_spec("onnxruntime") is None:
            return ["the onnxruntime Python module (pip install onnxruntime)"]
        return []


CPU = CpuTarget()


def check_host(m: EngineManifest, host: HostIsa, backend_versions: dict[str, str]) -> None:
    """Refuse a cpu engine this host cannot run, before anything of it is loaded.

    ``backend_versions`` maps backend name ("onnxruntime") to its installed version; a backend
    absent from it counts as not installed.

    Raises:
        EngineMismatchError: format version, target (not cpu), machine arch, ISA features or
            the backend's major.minor version differ; the message says what to rebuild or install.
    """
    if m.format_version != FORMAT_VERSION:
        raise_format_mismatch(m.format_version, MANIFEST_NAME)
    rebuild = rebuild_command(m, CPU.name)
    if m.target != CPU.name:
        raise EngineMismatchError(
            f"engine built for {m.target} is not a cpu engine; rebuild it for this host "
            f"({host.name}) with {rebuild}"
        )
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
    (``installed``: the plugin package's version here, None when it is not installed).

    Raises:
        EngineMismatchError: naming both versions and what to install or rebuild.
    """
    needed = manifest.execution_provider_version
    if needed is None:
        return
    if installed is None or installed.split(".")[:2] != needed.split(".")[:2]:
        rebuild = "--dtype float32"
        if manifest.execution_provider == HYBRID:  # a float32 engine: the CPU EP runs it alone
            rebuild = "--execution-provider cpu"
        raise EngineMismatchError(
            f"engine runs on {manifest.execution_provider} {needed} but "
            f"{installed or 'no version'} is installed; pip install the matching "
            f"{PROVIDER_PACKAGES.get(manifest.execution_provider, 'package')}, or rebuild the "
            f"engine with {rebuild}"
        )


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(re.split(r"[.+-]", version)[:2])
