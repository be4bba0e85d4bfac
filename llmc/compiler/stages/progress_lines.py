"""Build progress as lines, for logs that are not a terminal (a CI runner's, a file).

rich's progress bars draw only on a terminal; elsewhere a build would print nothing for minutes.
``LineDisplay`` prints one line when a stage starts and when it ends (its wall time and peak
RSS), a line for its sub-steps (calibration windows, layers quantized, scorings, the TensorRT
builder's phases) at most every ``tick_every_s``, and a heartbeat naming the running stage when
nothing was printed for ``heartbeat_s`` (a minute), so a log shows where the build is at least
once a minute. RSS is the process's plus its child processes', sampled every second. With
``json`` each line is one JSON object: ``{"event": "start"|"progress"|"heartbeat"|"done",
"stage", "elapsed_s", "rss_gb", ...}`` (``done`` adds ``wall_s`` and ``peak_rss_gb``; progress
adds ``done`` and ``total``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import TextIO


class LineDisplay:
    """Stage lines on ``stream`` (the ``display`` of ``BuildProgress`` off a terminal).

    Args:
        stream: where lines go (stderr).
        json_lines: one JSON object per line instead of text.
        heartbeat_s: seconds without a line after which the running stage is named again.
        tick_every_s: the least seconds between two progress lines of one stage.
        sample_s: seconds between RSS samples (default: 1, or a quarter of ``heartbeat_s``
            when that is less).
    """

    def __init__(
        self,
        stream: TextIO,
        json_lines: bool = False,
        heartbeat_s: float = 60.0,
        tick_every_s: float = 10.0,
        sample_s: float | None = None,
    ) -> None:
        self.stream, self.json_lines = stream, json_lines
        self.heartbeat_s, self.tick_every_s = heartbeat_s, tick_every_s
        self.sample_s = sample_s if sample_s is not None else min(1.0, heartbeat_s / 4)
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._stages: list[str] = []  # running stages, innermost last
        self._peaks: dict[str, int] = {}
        self._last_line = self._start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sampler and heartbeat thread."""
        self._thread = threading.Thread(target=self._watch, name="build-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (no line after this)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def stage(self, name: str, peak: Callable[[], int] | None = None):
        """One stage's start and done lines; yields ``tick(done, total)``. The done line's
        peak RSS is the highest of this display's samples and ``peak()`` (bytes), if given."""
        rss = _rss()
        with self._lock:
            self._stages.append(name)
            self._peaks[name] = rss
        self._emit("start", name, rss)
        begin, last_tick = time.perf_counter(), 0.0

        def tick(done: int, total: int) -> None:
            nonlocal last_tick
            now = time.perf_counter()
            if now - last_tick >= self.tick_every_s or done == total:
                last_tick = now
                self._emit("progress", name, _rss(), done=done, total=total)

        try:
            yield tick
        finally:
            with self._lock:
                self._stages.remove(name)
                sampled = max(self._peaks.pop(name), _rss())
            wall = time.perf_counter() - begin
            most = max(sampled, peak() if peak is not None else 0)
            self._emit("done", name, _rss(), wall_s=round(wall, 1), peak_rss_gb=_gb(most))

    def _watch(self) -> None:
        while not self._stop.wait(self.sample_s):
            rss = _rss()
            with self._lock:
                for name in self._stages:
                    self._peaks[name] = max(self._peaks[name], rss)
                running = self._stages[-1] if self._stages else None
                quiet = time.perf_counter() - self._last_line >= self.heartbeat_s
            if running is not None and quiet:
                self._emit("heartbeat", running, rss)

    def _emit(self, event: str, stage: str, rss: int, **extra) -> None:
        now = time.perf_counter()
        elapsed = round(now - self._start, 1)
        if self.json_lines:
            record = {"event": event, "stage": stage, "elapsed_s": elapsed, "rss_gb": _gb(rss)}
            line = json.dumps(record | extra)
        else:
            now_rss = "" if event == "done" else f" (RSS {_gb(rss)} GB)"
            line = f"[{elapsed:8.1f} s] {_describe(event, stage, extra)}{now_rss}"
        with self._lock:
            self._last_line = now
            print(line, file=self.stream, flush=True)


def _describe(event: str, stage: str, extra: dict) -> str:
    if event == "start":
        return f"start: {stage}"
    if event == "progress":
        return f"{stage}: {extra['done']}/{extra['total']}"
    if event == "heartbeat":
        return f"still in: {stage}"
    return f"done: {stage} in {extra['wall_s']} s, peak RSS {extra['peak_rss_gb']} GB"


def _gb(n: int) -> float:
    return round(n / 1e9, 2)


def _rss() -> int:
    """Resident bytes of this process and its children."""
    import psutil

    from llmc.compiler.stages.build_stats import process_rss

    return process_rss(psutil.Process())
