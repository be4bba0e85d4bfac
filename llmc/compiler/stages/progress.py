"""Build progress: the callback every stage takes (``Stage``: ``stage(name)`` opens a named step
and yields ``tick(done, total)`` for its sub-steps), and its display (``BuildProgress``): rich's
bars on a terminal, one line per stage with its elapsed time; elsewhere (a CI log, a file) plain
or JSON lines with elapsed time and peak RSS, at least once a minute (``progress_lines``)."""

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


#: ``--log-format`` choices: auto (rich on a terminal, text lines elsewhere), text, json.
LOG_FORMATS = ("auto", "text", "json")


class BuildProgress:
    """Shows each build stage as it runs; a stage may report sub-steps via the yielded tick.

    Args:
        log_format: one of ``LOG_FORMATS``.
        stream: where it writes (default: stderr); "auto" draws rich's bars only when it is a
            terminal.
        heartbeat_s: off a terminal, the longest silence before the running stage is named
            again (seconds).
    """

    def __init__(self, log_format: str = "auto", stream=None, heartbeat_s: float = 60.0):
        import sys

        from llmc.compiler.stages.progress_lines import LineDisplay

        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        stream = stream if stream is not None else sys.stderr
        terminal = log_format == "auto" and stream.isatty()
        json_lines = log_format == "json"
        self._display = (
            _RichDisplay(stream) if terminal else LineDisplay(stream, json_lines, heartbeat_s)
        )

    def __enter__(self) -> BuildProgress:
        self._display.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._display.stop()
        return False

    def stage(self, name: str, peak: Callable[[], int] | None = None):
        """Context manager for one stage; yields ``tick(done, total)`` for sub-steps.
        ``peak()``: the stage's exact peak RSS so far (bytes, ``BuildStats``), which a line
        display's end line reports where it exceeds what its own sampling saw."""
        return self._display.stage(name, peak)


class _RichDisplay:
    """rich's progress bars: one per stage, its elapsed time once done."""

    def __init__(self, stream) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.console = Console(file=stream)
        self._progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )

    def start(self) -> None:
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    @contextmanager
    def stage(self, name: str, peak: Callable[[], int] | None = None):
        task = self._progress.add_task(name, total=1)
        start = time.perf_counter()

        def tick(done: int, total: int) -> None:
            self._progress.update(task, completed=done, total=total)

        yield tick
        total = self._progress.tasks[task].total or 1
        self._progress.update(task, completed=total)
        self._progress.update(task, description=f"{name} ({time.perf_counter() - start:.1f} s)")
