"""The execution provider an engine runs on, as its manifest records it.

``CPUExecutionProvider`` ships with onnxruntime and runs the float32 engine graph as optimized at
build time. ``OpenVINOExecutionProvider`` (PyPI ``onnxruntime-ep-openvino``, a plugin EP) runs
the same graph with bfloat16 compute on AVX-512 BF16 hosts: measured 1.5-2.8x the CPU EP's speed
on Gemma 3 270M here (DESIGN §9), at up to ~0.1 relative difference in logits, so it serves
``--dtype bfloat16`` engines only. Which provider an engine runs on is chosen at build time by
measurement (``llmc.compiler.provider_choice``) and recorded in its manifest; how a session is
bound to it is the runtime's (``llmc.runtime.execution_provider``).
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_EP = "CPUExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"
OPENVINO_PACKAGE = "onnxruntime-ep-openvino"


@dataclass(frozen=True)
class ProviderChoice:
    """The execution provider an engine runs on and the compute precision it asks of it."""

    name: str
    precision: str  # "f32" or "bf16"

    @property
    def optimize_at_build(self) -> bool:
        """The CPU EP's graph is optimized and saved at build time; OpenVINO compiles at load."""
        return self.name == CPU_EP


def provider_for_dtype(dtype: str) -> ProviderChoice:
    """float32 -> CPU EP; bfloat16 -> OpenVINO EP with bf16 inference precision."""
    if dtype == "bfloat16":
        return ProviderChoice(OPENVINO_EP, "bf16")
    return ProviderChoice(CPU_EP, "f32")


def provider_version(choice: ProviderChoice) -> str | None:
    """Installed version of the plugin package behind ``choice``; None for the built-in CPU EP
    or when the package is not installed."""
    if choice.name == CPU_EP:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(OPENVINO_PACKAGE)
    except PackageNotFoundError:
        return None
