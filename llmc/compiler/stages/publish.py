"""Publish a built engine into a registry (``--registry PATH``)."""

from __future__ import annotations

from pathlib import Path

from llmc.compiler.config.destination import DestinationOptions
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.result import BuildResult
from llmc.registry.index import IndexEntry
from llmc.registry.local import LocalRegistry


def publish(
    destination: DestinationOptions, engine_dir: Path, stage: Stage = no_stage
) -> IndexEntry | None:
    """With ``destination.registry``, publish the engine in ``engine_dir`` there
    (``LocalRegistry.publish``) and return its ``IndexEntry``; None without a registry. Raises
    what ``LocalRegistry.publish`` raises."""
    if not destination.registry:
        return None
    with stage("publish to the registry"):
        return LocalRegistry(Path(destination.registry)).publish(engine_dir)


def publish_result(
    destination: DestinationOptions,
    engine_dir: Path,
    stage: Stage,
    pass_report: dict[str, int],
    optimized_ops: dict[str, int],
    quantization: dict | None,
    accuracy_report=None,
) -> BuildResult:
    """Publish the engine in ``engine_dir`` (``publish``) and return the build's result: the
    last step of every target's build."""
    entry = publish(destination, engine_dir, stage)
    return BuildResult(
        engine_dir,
        pass_report,
        optimized_ops,
        quantization,
        accuracy_report,
        entry,
        destination.registry,
    )
