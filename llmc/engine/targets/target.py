"""``Target``: what one ``--arch`` value says about the engines built for it.

A target names the backend that builds and runs its engines, the compute dtypes it offers, and
how a host is checked before one of its engines is loaded. The registry of targets is
``llmc.engine.targets.TARGETS``; each kind of target is one module beside this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmc.errors import LlmcError

if TYPE_CHECKING:
    from llmc.engine.manifest import EngineManifest


class UnknownTargetError(LlmcError, ValueError):
    """A target name that is not in the registry; the message lists the known ones."""


@runtime_checkable
class Target(Protocol):
    """One engine target (an ``--arch`` value and a manifest's ``target``).

    Attributes:
        name: the registry key, ``--arch`` value and manifest ``target`` ("cpu", "sm90").
        backend: what builds and runs its engines, as a manifest's ``backend`` says it:
            "onnxruntime" or "tensorrt".
        dtypes: the compute and weight dtypes (``--dtype``) its engines may have.
        default_dtype: the dtype of a build that names none; one of ``dtypes``.
        execution_providers: the ONNX Runtime execution providers (``--execution-provider``
            values, ``llmc.engine.provider.PROVIDERS``) its engines may run on; empty for a
            target whose backend has none.
        capability: the GPU compute capability (major, minor) its plans need; None for a
            target that runs on no GPU.
    """

    name: str
    backend: str
    dtypes: tuple[str, ...]
    default_dtype: str
    execution_providers: tuple[str, ...]
    capability: tuple[int, int] | None

    def check_runs_here(self, manifest: EngineManifest) -> None:
        """Refuse ``manifest``'s engine (built for this target) when this host cannot run it,
        before any of its files is deserialized.

        Raises:
            EngineMismatchError: says what differs and what to rebuild or install.
        """
        ...

    def missing_for_build(self) -> list[str]:
        """What this host lacks to build an engine for this target natively, as phrases for a
        message; empty when it can."""
        ...
