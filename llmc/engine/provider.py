"""The execution provider an engine runs on, as its manifest records it.

``CPUExecutionProvider`` ships with onnxruntime and runs the float32 engine graph as optimized at
build time. ``OpenVINOExecutionProvider`` (PyPI ``onnxruntime-ep-openvino``, a plugin EP) runs
the same graph with bfloat16 compute on AVX-512 BF16 hosts: measured 1.5-2.8x the CPU EP's speed
on Gemma 3 270M here (DESIGN §9), at up to ~0.1 relative difference in logits, so it serves
``--dtype bfloat16`` engines only. ``OpenVINORuntime`` is not an ONNX Runtime provider: the
engine's segments compiled by OpenVINO's own runtime (PyPI ``openvino``), which runs on any
x86-64 CPU, AMD's included, where the OpenVINO EP exposes no device
(``llmc.runtime.runners.openvino_runner``). ``CPUExecutionProvider+OpenVINORuntime`` runs a CPU EP
engine's steps of few new tokens on the CPU EP's single graph and its larger steps through the
same engine's segments compiled by OpenVINO's runtime (whose int4 kernels lead on bare MatMuls
from a few rows up), over one KV cache (``llmc.runtime.runners.hybrid_runner``). Providers are a
sub-axis of the ``cpu`` target (``llmc.engine.targets.cpu``), named on the command line by
the keys of ``PROVIDERS``. Which provider an engine runs on is chosen at build time by
measurement (``llmc.compiler.backends.onnxruntime.provider_choice``) and recorded in its manifest;
how a session is
bound to it is the runtime's (``llmc.runtime.runners.execution_provider``).
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_EP = "CPUExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"
OPENVINO_RUNTIME = "OpenVINORuntime"
HYBRID = "CPUExecutionProvider+OpenVINORuntime"
OPENVINO_PACKAGE = "onnxruntime-ep-openvino"
OPENVINO_RUNTIME_PACKAGE = "openvino"
#: ``--execution-provider`` value -> the provider it names (an ONNX Runtime execution provider,
#: or OpenVINO's runtime on the segments).
PROVIDERS = {
    "cpu": CPU_EP,
    "openvino": OPENVINO_EP,
    "openvino-runtime": OPENVINO_RUNTIME,
    "cpu+openvino-runtime": HYBRID,
}
#: The package each non-built-in provider needs.
PROVIDER_PACKAGES = {
    OPENVINO_EP: OPENVINO_PACKAGE,
    OPENVINO_RUNTIME: OPENVINO_RUNTIME_PACKAGE,
    HYBRID: OPENVINO_RUNTIME_PACKAGE,
}
#: Distributions that install the ``onnxruntime`` module, the plain CPU build first.
ONNXRUNTIME_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino")


@dataclass(frozen=True)
class ProviderChoice:
    """The execution provider an engine runs on and the compute precision it asks of it."""

    name: str
    precision: str  # "f32" or "bf16"
    #: The hybrid's boundary: steps of at least this many new tokens run on OpenVINO's runtime
    #: (None: the runner's default).
    min_large_tokens: int | None = None

    @property
    def optimize_at_build(self) -> bool:
        """The CPU EP's graph is optimized and saved at build time (the hybrid runs that graph
        and compiles its segments with OpenVINO at load); OpenVINO compiles at load."""
        return self.name in (CPU_EP, HYBRID)


def provider_for_dtype(dtype: str) -> ProviderChoice:
    """float32 -> CPU EP; bfloat16 -> OpenVINO EP with bf16 inference precision."""
    if dtype == "bfloat16":
        return ProviderChoice(OPENVINO_EP, "bf16")
    return ProviderChoice(CPU_EP, "f32")


def onnxruntime_version() -> str | None:
    """Version of the installed ONNX Runtime (the ``onnxruntime`` module's distribution), or
    None when it is not installed. Read from package metadata: importing ``onnxruntime`` costs
    ~0.2 s that a host check does not need."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version
    from importlib.util import find_spec

    if find_spec("onnxruntime") is None:
        return None
    for dist in ONNXRUNTIME_PACKAGES:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    others = packages_distributions().get("onnxruntime", [])  # another build of it (slower)
    return version(others[0]) if others else None


def provider_version(choice: ProviderChoice) -> str | None:
    """Installed version of the package behind ``choice`` (``PROVIDER_PACKAGES``); None for the
    built-in CPU EP or when the package is not installed."""
    if choice.name not in PROVIDER_PACKAGES:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PROVIDER_PACKAGES[choice.name])
    except PackageNotFoundError:
        return None
