"""The progress callback every stage takes: ``stage(name)`` opens a named step and yields
``tick(done, total)`` for its sub-steps
(``llmc.compiler.stages.build_progress.BuildProgress.stage``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

Tick = Callable[[int, int], None]
Stage = Callable[[str], AbstractContextManager[Tick]]


def _no_tick(done: int, total: int) -> None:
    return None


def no_stage(name: str) -> AbstractContextManager[Tick]:
    """A progress stage that reports nothing (``BuildProgress.stage`` without a display)."""
    return nullcontext(_no_tick)


def stage_of(progress: Any) -> Stage:
    """``progress.stage`` of a ``BuildProgress``, or ``no_stage`` for None."""
    return progress.stage if progress is not None else no_stage
