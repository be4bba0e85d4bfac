"""Build progress: the callback every stage takes (``Stage``: ``stage(name)`` opens a named step
and yields ``tick(done, total)`` for its sub-steps), and its display on the terminal
(``BuildProgress``, rich: one line per stage with its elapsed time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
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


class BuildProgress:
    """Shows each build stage as it runs; a stage may report sub-steps via the yielded tick."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.console = Console(stderr=True)
        self._progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )

    def __enter__(self) -> BuildProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._progress.stop()
        return False

    @contextmanager
    def stage(self, name: str):
        """Context manager for one stage; yields ``tick(done, total)`` for sub-steps."""
        task = self._progress.add_task(name, total=1)
        start = time.perf_counter()

        def tick(done: int, total: int) -> None:
            self._progress.update(task, completed=done, total=total)

        yield tick
        total = self._progress.tasks[task].total or 1
        self._progress.update(task, completed=total)
        self._progress.update(task, description=f"{name} ({time.perf_counter() - start:.1f} s)")
