"""Wall time and peak resident memory of each build stage, recorded into the manifest.

A sampler thread reads the build's resident set size (psutil, every ``interval_s``: the
process's plus its child processes', e.g. TensorRT for RTX's builder) while a stage runs and
keeps the stage's peak. A sampler misses what a stage allocates and frees between two samples
(or while a thread holds the GIL): on Linux the process's own high-water mark (``VmHWM``) is
read at each stage's start and end too, and a stage in which it rose has it as its peak, so
the build's peak (the highest stage's) is exact for the process itself (Gemma 3 270M's fp8
accuracy-target search peaked 0.44 GB above what sampling saw). The mark is never reset (that would
also reset what ``/usr/bin/time`` and ``getrusage`` report). The build's ``stage`` callable
wraps the display's (``BuildProgress.stage``) with this one, so every stage is measured whether
or not a terminal shows it. RSS includes file pages the process has mapped and touched
(memory-mapped checkpoint and external-data files), which is what the kernel charges the build
for.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from llmc.heap import release_freed_memory


@dataclass
class StageStats:
    """One stage: wall time (s) and the process's peak RSS while it ran (bytes)."""

    wall_s: float
    peak_rss_bytes: int


@dataclass
class BuildStats:
    """Per-stage measurements of one build, in the order the stages ran.

    ``display`` is the progress display's stage context manager (``BuildProgress.stage``) or
    None. Use ``stats.stage(name)`` as the build's stage callable.
    """

    display: object = None
    interval_s: float = 0.05
    stages: dict[str, StageStats] = field(default_factory=dict)
    _start: float = field(default_factory=time.perf_counter)

    @contextmanager
    def stage(self, name: str):
        """Time ``name`` and sample its peak RSS; yields the display's ``tick(done, total)``."""
        import psutil

        # What earlier stages dropped (ONNX IR graphs are reference cycles; the C heap keeps
        # freed pages) is released here, so a stage's peak does not stack on it.
        release_freed_memory()
        proc = psutil.Process()
        mark = high_water_mark()
        peak = process_rss(proc)
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(self.interval_s):
                peak = max(peak, process_rss(proc))

        def peak_now() -> int:
            """The stage's peak so far: sampled, or the process's mark where it rose."""
            now = high_water_mark()
            risen = now if mark is not None and now is not None and now > mark else 0
            return max(peak, process_rss(proc), risen)

        sampler = threading.Thread(target=sample, name=f"rss:{name}", daemon=True)
        sampler.start()
        start = time.perf_counter()
        try:
            if self.display is not None:
                with self.display(name, peak_now) as tick:
                    yield tick
            else:
                yield lambda done, total: None
        finally:
            stop.set()
            sampler.join()
            self.stages[name] = StageStats(time.perf_counter() - start, peak_now())

    @property
    def peak_rss_bytes(self) -> int:
        """The highest peak of any stage (bytes)."""
        return max((s.peak_rss_bytes for s in self.stages.values()), default=0)

    def to_dict(self) -> dict:
        """``{"wall_s", "peak_rss_bytes", "stages": {name: {"wall_s", "peak_rss_bytes"}}}``:
        the manifest's ``build_stats``."""
        return {
            "wall_s": round(time.perf_counter() - self._start, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            "stages": {
                k: {"wall_s": round(v.wall_s, 3), "peak_rss_bytes": v.peak_rss_bytes}
                for k, v in self.stages.items()
            },
        }


def process_rss(proc) -> int:
    """Resident bytes of ``proc`` (a ``psutil.Process``) and its living child processes."""
    import psutil

    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # exited between the listing and the read
            pass
    return total


def high_water_mark() -> int | None:
    """This process's peak RSS so far (Linux ``VmHWM``, bytes); None where ``/proc`` does not
    offer it (another OS, a restricted ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024  # kB
