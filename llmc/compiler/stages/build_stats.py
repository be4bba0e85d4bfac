"""Wall time and peak resident memory of each build stage, recorded into the manifest.

A sampler thread reads the build's resident set size (psutil, every ``interval_s``: the
process's plus its child processes', e.g. TensorRT for RTX's builder) while a stage runs and
keeps the stage's peak. A sampler misses what a stage allocates and frees between two samples
(or while a thread holds the GIL): on Linux the process's own high-water mark (``VmHWM``) is
read too, and reset to the current RSS at each stage's start (``/proc/self/clear_refs``), so a
stage's peak is exact for the process itself (Gemma 3 270M's fp8 accuracy-target search: 3.42
GB, where sampling saw 2.98). The build's ``stage`` callable
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
    #: peaks of the stages running now, outermost first (a nested stage resets the mark)
    _open: list[list[int]] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str):
        """Time ``name`` and sample its peak RSS; yields the display's ``tick(done, total)``."""
        import psutil

        # What earlier stages dropped (ONNX IR graphs are reference cycles; the C heap keeps
        # freed pages) is released here, so a stage's peak does not stack on it.
        release_freed_memory()
        proc = psutil.Process()
        self._fold(take_peak())
        peak = [process_rss(proc)]
        self._open.append(peak)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self.interval_s):
                peak[0] = max(peak[0], process_rss(proc))

        sampler = threading.Thread(target=sample, name=f"rss:{name}", daemon=True)
        sampler.start()
        start = time.perf_counter()
        try:
            if self.display is not None:
                with self.display(name, lambda: self._peak_now(peak)) as tick:
                    yield tick
            else:
                yield lambda done, total: None
        finally:
            stop.set()
            sampler.join()
            peak[0] = max(peak[0], process_rss(proc))
            self._fold(take_peak())
            self._open = [p for p in self._open if p is not peak]
            self.stages[name] = StageStats(time.perf_counter() - start, peak[0])

    def _peak_now(self, peak: list[int]) -> int:
        """The peak of the open stage whose cell is ``peak``, the high-water mark counted."""
        self._fold(take_peak())
        return peak[0]

    def _fold(self, mark: int | None) -> None:
        """Count the high-water mark ``mark`` (bytes; None: not known) in every open stage."""
        for peak in self._open if mark is not None else ():
            peak[0] = max(peak[0], mark)

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


def take_peak() -> int | None:
    """This process's peak RSS since the last call (Linux ``VmHWM``, bytes), reset to its
    current RSS; None where ``/proc`` does not offer both (another OS, a restricted
    ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024  # kB
