"""The targets an engine is built for: one registry, one module per kind of target.

- ``target``: the ``Target`` protocol every target meets (name, backend, dtypes, default dtype,
  execution providers, compute capability, host check, what a build here lacks);
- ``cpu``: ``cpu``, an ONNX Runtime engine for this host's ISA; its execution providers
  (CPU EP, OpenVINO EP) are a sub-axis of it;
- ``sm``: ``sm80`` ... ``sm120``, TensorRT plans, one per row of ``SM_TABLE``.

``TARGETS`` maps each name (``--arch`` value, manifest ``target``) to its target. Adding a
target is one module and one entry below; adding a GPU architecture is one row of
``sm.SM_TABLE``. The host check (``llmc.engine.host.check_runs_here``), the runtime's choice of
runner, the TensorRT lint and the quantization formats' target rules all read this registry.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmc.engine.targets.cpu import CPU
from llmc.engine.targets.sm import SM_TARGETS
from llmc.engine.targets.target import Target, UnknownTargetError

__all__ = ["TARGETS", "Target", "UnknownTargetError", "registry", "target", "target_names"]


def registry(*targets: Target) -> dict[str, Target]:
    """A registry of ``targets`` by name, in the given order.

    Raises:
        ValueError: two targets share a name, or a target's default dtype is not one of its
            dtypes.
    """
    out: dict[str, Target] = {}
    for t in targets:
        if t.name in out:
            raise ValueError(f"two targets are named {t.name!r}")
        if t.default_dtype not in t.dtypes:
            raise ValueError(f"target {t.name}: default dtype {t.default_dtype} not in {t.dtypes}")
        out[t.name] = t
    return out


TARGETS: dict[str, Target] = registry(CPU, *SM_TARGETS)


def target(name: str, targets: Mapping[str, Target] = TARGETS) -> Target:
    """The target called ``name`` in ``targets`` (default: the registry).

    Raises:
        UnknownTargetError: (a ValueError) no such target; the message lists the known ones.
    """
    found = targets.get(name)
    if found is None:
        raise UnknownTargetError(f"unknown target {name!r}; known targets: {', '.join(targets)}")
    return found


def target_names(*backends: str, targets: Mapping[str, Target] = TARGETS) -> tuple[str, ...]:
    """The names of ``targets`` in registry order, only those of ``backends`` when given
    ("onnxruntime", "tensorrt", "tensorrt-rtx")."""
    return tuple(n for n, t in targets.items() if not backends or t.backend in backends)
