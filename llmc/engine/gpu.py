"""What this host offers a TensorRT target: the ``tensorrt`` package and CUDA GPUs.

Checked without importing ``tensorrt`` (its import loads the CUDA libraries, and on a host without
them fails): the package is looked up with ``importlib`` and GPUs through torch's CUDA runtime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device: its index, name and compute capability (major, minor)."""

    index: int
    name: str
    capability: tuple[int, int]

    @property
    def arch(self) -> str:
        """The llmc target of this device, e.g. "sm90"."""
        return f"sm{self.capability[0]}{self.capability[1]}"


def arch_capability(arch: str) -> tuple[int, int]:
    """Compute capability of a GPU target: "sm90" -> (9, 0), "sm120" -> (12, 0). Raises
    ValueError for a target that is not ``sm<major><minor>``."""
    m = re.fullmatch(r"sm(\d+)(\d)", arch)
    if m is None:
        raise ValueError(f"{arch!r} is not a GPU target like sm90")
    return int(m.group(1)), int(m.group(2))


def capability_name(arch: str) -> str:
    """ "sm90" -> "9.0"."""
    major, minor = arch_capability(arch)
    return f"{major}.{minor}"


def detect_gpus() -> list[GpuInfo]:
    """The CUDA devices torch sees (empty without CUDA, e.g. on a CPU-only torch build)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        GpuInfo(i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))
        for i in range(torch.cuda.device_count())
    ]


def tensorrt_version() -> str | None:
    """Version of the installed ``tensorrt`` Python package, or None when it is not importable
    (not installed, or only the pip stub whose libraries never downloaded)."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    for dist in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def missing_for_build(arch: str, gpus: list[GpuInfo] | None = None) -> list[str]:
    """What this host lacks to build a TensorRT plan for ``arch``, as phrases for a message
    (empty when it can): the ``tensorrt`` module, a GPU of the target's compute capability."""
    gpus = detect_gpus() if gpus is None else gpus
    missing = []
    if tensorrt_version() is None:
        missing.append("the tensorrt Python module (pip install tensorrt; needs CUDA)")
    wanted = arch_capability(arch)
    if not any(g.capability == wanted for g in gpus):
        found = ", ".join(f"{g.name} ({g.arch})" for g in gpus) or "no CUDA GPU"
        missing.append(f"a GPU of compute capability {capability_name(arch)} (found: {found})")
    return missing
