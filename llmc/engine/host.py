"""Whether this host runs an engine: ``check_runs_here``, before anything of it is loaded.

The engine's manifest names its target; the target (``llmc.engine.targets``) says what a host
needs to run it and checks that: a cpu engine this machine's architecture, the ISA features it
was built for (executed, ``llmc.engine.isa``), the ONNX Runtime major.minor that built it and
its execution provider's plugin major.minor (``targets.cpu``); an sm engine a GPU it runs on and
exactly the TensorRT release that built it (``targets.sm``; checked without importing
``tensorrt``). Each refusal says what to rebuild or install. The registry's resolver runs the
same check on every candidate.

The targets' own checks, given the host's facts, are importable from here too:
``check_host`` and ``check_provider_version`` (cpu), ``check_gpu_host``,
``check_tensorrt_version`` and ``release`` (sm).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmc.engine.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    EngineManifest,
    damaged_hint,
    raise_format_mismatch,
)
from llmc.engine.targets import TARGETS, Target
from llmc.engine.targets.cpu import check_host, check_provider_version
from llmc.engine.targets.sm import check_gpu_host, check_tensorrt_version, release
from llmc.errors import EngineCorruptError, EngineMismatchError

__all__ = [
    "check_gpu_host",
    "check_host",
    "check_provider_version",
    "check_runs_here",
    "check_tensorrt_version",
    "release",
]


def check_runs_here(manifest: EngineManifest, targets: Mapping[str, Target] = TARGETS) -> None:
    """Refuse an engine this host cannot run: its format version, then its target's host check
    (``Target.check_runs_here``), the target looked up by name in ``targets`` (default: the
    registry), then whether the manifest's backend is that target's (the runtime picks its
    runner by the target's backend). Deserializes nothing.

    Raises:
        EngineMismatchError: another format version, a target ``targets`` does not know, or
            what the target's check refuses; says what to rebuild or install.
        EngineCorruptError: the manifest's backend is not its target's.
    """
    if manifest.format_version != FORMAT_VERSION:
        raise_format_mismatch(manifest.format_version, MANIFEST_NAME)
    found = targets.get(manifest.target)
    if found is None:
        raise EngineMismatchError(
            f"engine built for target {manifest.target!r}, which this llmc does not know "
            f"(known: {', '.join(targets)}); rebuild it for one of them with "
            f"`llmc build {manifest.source} --arch ...`"
        )
    found.check_runs_here(manifest)
    if manifest.backend != found.backend:
        raise EngineCorruptError(
            f"{MANIFEST_NAME} says target {found.name} but backend {manifest.backend!r} "
            f"({found.name} engines run on {found.backend}); {damaged_hint(manifest)}"
        )
