"""Score per-module format assignments without building engines (``--accuracy-target``).

The float graph runs segment by segment over token windows (``LayerwiseRunner``), as for the
accuracy report's reference; before each segment's session is made, the modules the assignment
quantizes get their Q/DQ nodes written into that segment (the ``QuantizedLinear``s made once
per module and format while calibration statistics were in memory), and each format's CPU
rewrite (FP8 emulation, ...) runs on it. So an assignment costs one pass over the windows, the
float model's weights are read one segment at a time, and the numbers are those of the Q/DQ
graph the build would write, attention run with the engine's ``fpmath_mode`` (bfloat16 prefill
on AMX hosts). Logits are scored against the float graph's, computed once per window set and
kept in a temporary file (``spill_logits``); in a streamed build the float run's segment
entries a scoring starts from are kept in one too (``entry_spill``).

Segments are optimized as the CPU lowering optimizes them, so quantized MatMuls run on the
engine's fused kernels. Not modelled: a quantized KV cache (``--kv-cache-dtype``); the engine's
own accuracy report confirms the choice.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from llmc.calibration.accuracy import (
    AccuracyReport,
    LogitsChunk,
    pooled_report,
    score_window_chunks,
)
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.search.assignment import FLOAT
from llmc.compiler.quantize.search.entry_spill import drop_entry_pages, spill_entries
from llmc.compiler.quantize.search.segment_quantizer import quantize_segment
from llmc.heap import release_freed_memory
from llmc.quant.protocol import QuantizedLinear

Assignment = tuple[tuple[str, str], ...]
#: Live tensors the streams of one ``score_each`` run may hold, counted as a float run's
#: largest segment entry (the windows' residual streams and boundary tensors) per stream.
#: Gemma 3 270M's fp8 -> top1=0.95 search (38 one-unit sensitivity scorings of 4 windows x 256
#: tokens) runs them in batches of 15, 15, 7 so; at most 2.1 GB resident between segments.
STREAM_BYTES = 128 << 20
#: Logits positions per run of the last segment when scoring (``LayerwiseRunner``'s
#: ``logits_rows``): [64, 262,144] float32 is 67 MB a copy, where a whole 256-token window's
#: logits are 0.27 GB, several times over in ONNX Runtime (Gemma 3 270M's held-out scoring
#: peaked 0.6 GB over its size bar so); the last segment's layers run T/64 times instead of once.
LOGITS_ROWS = 64
Prepare = Callable[[onnx.ModelProto, str], onnx.ModelProto]


class AssignmentScorer:
    """Scores assignments of ``precomputed`` quantized modules on named window sets.

    Args:
        float_model: the float engine graph (weights in it, or external data in
            ``weights_dir``).
        precomputed: {(module, format name): QuantizedLinear} for every pair an assignment
            may name.
        windows: {set name: [T] int64 token windows}, e.g. "sensitivity" and "heldout".
        labels: {set name: the text's origin, as the accuracy report records it}.
        threads: ORT intra-op threads.
        weights_dir: where the float graph's external data is.
        prepare: the float graph's own segment preparation (widening 16-bit stored weights,
            ``stored_weights.segment_widener``), run first.
        session_config: the engine's ONNX Runtime session entries (``pipeline.session_config``):
            assignments run with the engine's fused kernels (``LayerwiseRunner``'s
            ``engine_kernels``), e.g. MatMulNBits at the engine's accuracy level.
        strides: {set name: k}: score only every k-th position of that set's windows (its
            logits are computed for those positions only: the vocabulary projection and the
            KL over it, most of a scoring's time at a 262,144-token vocabulary, shrink k
            times). Sets not named score every position.
        attention_fpmath: the engine's attention numerics (``FPMATH_MODES``;
            ``engine_attention_fpmath``): assignments are scored with them, so a host whose
            kernel rounds prefill attention to bfloat16 (AMX) scores what its engine will
            report; the float reference stays "strict", as the accuracy report's.
        resumable: window sets whose float run's segment entries are kept (``SegmentEntry``,
            one run more, and every boundary's tensors of those windows held): an assignment
            whose first quantized module is in segment k starts there, its first k segments
            being the float graph's. The search's one-unit sensitivity scorings run half the
            graph on average so.
        block_int8: run 8-bit weight-only modules on ``llmc::BlockInt8MatMul``
            (``engine_int8``), as the cpu engine built on this host does (``host.plan_cpu``'s
            ``block_int8``), instead of ONNX Runtime's ``MatMulNBits``.
    """

    def __init__(
        self,
        float_model: onnx.ModelProto,
        precomputed: dict[tuple[str, str], QuantizedLinear],
        windows: dict[str, list[np.ndarray]],
        labels: dict[str, str],
        threads: int | None,
        weights_dir: Path | None = None,
        prepare: Prepare | None = None,
        session_config: dict[str, str] | None = None,
        strides: dict[str, int] | None = None,
        attention_fpmath: str = "strict",
        resumable: tuple[str, ...] = (),
        block_int8: bool = False,
    ):
        self.float_model, self.precomputed = float_model, precomputed
        self.block_int8 = block_int8
        self.attention_fpmath, self.resumable = attention_fpmath, resumable
        self._entries: dict[str, dict] = {}
        self._screened: dict[tuple[Assignment, str], list[AccuracyReport]] = {}
        self._module_segment: dict[str, int] | None = None
        self.strides = strides or {}
        self.session_config = session_config or {}
        self.windows, self.labels = windows, labels
        self.threads, self.weights_dir, self.prepare = threads, weights_dir, prepare
        self._spills: dict[str, tuple[tempfile._TemporaryFileWrapper, list]] = {}
        self._entry_file = None  # the spilled segment entries (``entry_spill``)
        self._layerwise = None
        self.runs = 0

    def close(self) -> None:
        """Remove the reference logits' temporary files."""
        for spill, _ in self._spills.values():
            spill.close()
        self._spills.clear()
        self._entries.clear()
        if self._entry_file is not None:
            self._entry_file.close()
            self._entry_file = None
        self._screened.clear()
        self._layerwise = None  # its segments: a copy of the float graph's weights

    def __enter__(self) -> AssignmentScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score(self, assignment: Assignment, which: str) -> AccuracyReport:
        """The accuracy report of the float graph with ``assignment``'s (module, format) pairs
        quantized ("none" stays float), on window set ``which``, against the float graph; the
        windows a ``screen`` of the same assignment scored are not run again."""
        kept = self._screened.pop((assignment, which), [])
        rest = self._score_windows(assignment, which, range(len(kept), len(self.windows[which])))
        return pooled_report(kept + rest, self.labels[which])

    def score_each(self, assignments: list[Assignment], which: str) -> list[AccuracyReport]:
        """``score`` of each of ``assignments`` on set ``which``, in runs over the segments
        that share each segment's session among the assignments that quantize it alike
        (``LayerwiseRunner.run_streams``): for one-module assignments, one session per segment
        and module instead of one per segment and assignment. Each stream starts where
        ``score``'s would (``resumable`` sets). At most ``STREAM_BYTES`` of live tensors a run."""
        reports: list[AccuracyReport] = []
        size = self._stream_size(which)
        for start in range(0, len(assignments), size):
            batch = self._score_streams(assignments[start : start + size], which)
            reports += [pooled_report(r, self.labels[which]) for r in batch]
        return reports

    def _stream_size(self, which: str) -> int:
        """How many assignments one ``score_each`` run of set ``which`` takes: ``STREAM_BYTES``
        over the largest live tensors of a float run's segment entry (resumable sets; else one
        at a time)."""
        if which not in self.resumable:
            return 1
        entries = [e for e in self._float_entries(which).values() if e is not None]
        per_stream = max(
            (sum(a.nbytes for env in e.envs for a in env.values()) for e in entries), default=0
        )
        return max(1, STREAM_BYTES // max(1, per_stream))

    def _score_streams(
        self, assignments: list[Assignment], which: str, select: range | None = None
    ) -> list[list[AccuracyReport]]:
        """One report per window of set ``which``'s windows ``select`` (consecutive; default
        all) for each of ``assignments``, run as streams of one ``run_streams``."""
        from llmc.runtime.runners.layerwise_runner import Stream

        select = range(len(self.windows[which])) if select is None else select
        if not select:
            return [[] for _ in assignments]
        spill, shapes = self._reference(which)
        runner = self._runner()
        windows = self.windows[which][select.start : select.stop]
        positions = self._positions(which)
        positions = None if positions is None else positions[select.start : select.stop]
        offset = sum(rows * vocab for rows, vocab in shapes[: select.start]) * 4  # float32
        last = runner.num_segments - 1
        self.runs += 1
        # Variants only where streams share: a lone scoring's modules need no segment index
        # (the held-out set's, e.g. an anchor's vocabulary projection, are not looked up).
        shared = len(assignments) > 1
        streams = [
            Stream(
                self._start(a, which, select),
                self._quantizing(a),
                self._variant(a) if shared else None,
            )
            for a in assignments
        ]
        run = runner.run_streams(
            windows, streams, logits_indices=positions, attention_fpmath=self.attention_fpmath
        )
        finals = ((k, o) for k, o in run if o.segment == last and o.window is not None)
        reports: list[list[AccuracyReport]] = [[] for _ in assignments]
        for k, outputs in itertools.groupby(finals, key=lambda item: item[0]):
            chunks = _logits_chunks((o for _, o in outputs), runner.logits, spill, offset)
            reports[k] = score_window_chunks(chunks, windows, self.labels[which], None, positions)
        if which in self._entries:
            drop_entry_pages(self._entries[which])  # the spilled entries the streams read
        release_freed_memory()  # the scorings' logits and sessions, before the next ones
        return reports

    def _variant(self, assignment: Assignment):
        """``Stream.variant`` of ``assignment``: segment index -> its (module, format) pairs
        quantized in that segment (() where it is float)."""
        segments = self._segments_of_modules()
        by_segment: dict[int, list[tuple[str, str]]] = {}
        for module, fmt in assignment:
            if fmt != FLOAT:
                by_segment.setdefault(segments[module], []).append((module, fmt))
        return lambda i: tuple(sorted(by_segment.get(i, ())))

    def screen(self, assignment: Assignment, which: str, count: int) -> list[AccuracyReport]:
        """One report per window of the first ``count`` windows of set ``which`` (all when it
        has no more), kept for a ``score`` or a longer screening of the same assignment: the
        windows an earlier screening of it scored are not run again."""
        kept = self._screened.setdefault((assignment, which), [])
        stop = min(count, len(self.windows[which]))
        kept += self._score_windows(assignment, which, range(len(kept), max(stop, len(kept))))
        return kept[:stop]

    def _score_windows(self, assignment: Assignment, which: str, select: range):
        """One report per window of set ``which``'s windows ``select`` (consecutive)."""
        return self._score_streams([assignment], which, select)[0]

    def _start(self, assignment: Assignment, which: str, select: range | None = None):
        """The ``SegmentEntry`` a scoring of ``assignment`` on set ``which`` (its windows
        ``select``, default all) starts from: the float run's entry of the first segment with a
        quantized module (None: segment 0, or a set not ``resumable``)."""
        from llmc.runtime.runners.layerwise_runner import SegmentEntry

        if which not in self.resumable:
            return None
        segments = self._segments_of_modules()
        quantized = [segments[m] for m, fmt in assignment if fmt != FLOAT]
        first = min(quantized, default=self._runner().num_segments - 1)
        if first == 0:
            return None
        entry = self._float_entries(which)[first]
        select = select or range(len(entry.envs))
        return SegmentEntry(first, entry.envs[select.start : select.stop])

    def _segments_of_modules(self) -> dict[str, int]:
        """{module: the index of the segment holding its MatMul}, found once."""
        if self._module_segment is None:
            runner, found = self._runner(), {}
            for i in range(runner.num_segments):
                segment = ir.from_proto(runner.segment_to_run(i)[0])
                found.update((t.module, i) for t in find_targets(segment))
            self._module_segment = found
        return self._module_segment

    def _float_entries(self, which: str) -> dict:
        """{segment index: ``SegmentEntry``} of the float graph run on set ``which`` with the
        scorings' attention numerics, made once."""
        if which not in self._entries:
            runner = self._runner()
            keep = dict.fromkeys(range(1, runner.num_segments))
            run = runner.run(
                self.windows[which],
                logits_indices=self._positions(which),
                attention_fpmath=self.attention_fpmath,
                keep=keep,
            )
            for _ in run:
                pass
            if self.weights_dir is not None:  # a streamed build: the entries go to disk
                self._entry_file = self._entry_file or tempfile.TemporaryFile(dir=self.weights_dir)
                keep = spill_entries(keep, self._entry_file)
            self._entries[which] = keep
        return self._entries[which]

    def _positions(self, which: str) -> list[np.ndarray] | None:
        """The scored positions of each window of set ``which`` (None: all)."""
        k = self.strides.get(which)
        if k is None:
            return None
        return [np.arange(0, int(w.shape[0]) - 1, k, dtype=np.int64) for w in self.windows[which]]

    def _runner(self):
        """The float graph split into segments once (``LayerwiseRunner``), run with the
        engine's kernels; each run prepares its segments (``prepare``) its own way."""
        if self._layerwise is None:
            from llmc.runtime.runners.layerwise_runner import LayerwiseRunner

            self._layerwise = LayerwiseRunner(
                self.float_model,
                threads=self.threads,
                external_data_dir=self.weights_dir,
                prepare=self.prepare,
                engine_kernels=True,
                session_config=self.session_config,
                logits_rows=LOGITS_ROWS,
            )
        return self._layerwise

    def _reference(self, which: str):
        """(file, shapes) of the float graph's logits on window set ``which``, made once (with
        the same kernels as the scorings: ORT's float fusions move logits by ~1e-6)."""
        if which not in self._spills:
            spill = tempfile.TemporaryFile(dir=self.weights_dir)
            positions = self._positions(which)
            # The float graph has no MatMulNBits, so it runs without packed copies of its
            # weights (a float vocabulary projection's copy is 0.54 GB at Qwen2.5-0.5B's):
            # the same kernels, the same numbers (tests/compiler/test_layerwise_calibration.py).
            runner = self._runner()
            shapes = spill_logits(runner, self.windows[which], spill, None, positions, False)
            self._spills[which] = (spill, shapes)
        return self._spills[which]

    def _quantizing(self, assignment: Assignment) -> Prepare:
        """A ``LayerwiseRunner`` ``prepare`` writing ``assignment``'s Q/DQ into each segment."""
        wanted = {module: fmt for module, fmt in assignment if fmt != FLOAT}
        missing = [pair for pair in wanted.items() if pair not in self.precomputed]
        if missing:
            raise ValueError(f"no quantized weights for {missing[0]}")

        def prepare(segment: onnx.ModelProto, scratch: str) -> onnx.ModelProto:
            if self.prepare is not None:
                segment = self.prepare(segment, scratch)
            return quantize_segment(
                segment, wanted, self.precomputed, self.weights_dir, self.block_int8
            )

        return prepare


def _logits_chunks(outputs, logits: str, spill, offset: int):
    """``LogitsChunk``s of a scoring's last-segment ``outputs`` (in window order, each window's
    rows in order) against the reference logits in ``spill`` from byte ``offset`` on. Each
    chunk's reference is mapped from the file, not copied (the file's pages are cached: a
    read copied 4.3 GB per scoring of Gemma 3 270M's held-out set at ~3 GB/s), and unmapped
    once the chunk is scored."""
    for out in outputs:
        got = out.tensors[logits]
        want = np.memmap(spill, np.float32, "r", offset=offset, shape=got.shape)
        offset += got.size * 4  # float32
        yield LogitsChunk(out.window, out.rows or slice(0, None), want, got)
        del want


def spill_logits(
    runner, windows: list[np.ndarray], spill, progress, logits_indices=None, prepacking=True
) -> list[tuple[int, int]]:
    """Write the logits [L, V] float32 of each window, run by ``runner`` (a
    ``LayerwiseRunner``, its logits whole or in chunks of rows), to the binary file ``spill``
    in window order, each window's rows in order; return their shapes. No window's logits
    outlive this call. ``logits_indices``, ``prepacking``: as ``LayerwiseRunner.run``'s."""
    rows = [0] * len(windows)
    vocab = 0
    last = runner.num_segments - 1
    for out in runner.run(windows, progress, logits_indices, prepacking=prepacking):
        if out.segment == last and out.window is not None:
            logits = np.ascontiguousarray(out.tensors[runner.logits], np.float32)
            spill.write(memoryview(logits).cast("B"))
            rows[out.window] += logits.shape[0]
            vocab = logits.shape[1]
    return [(n, vocab) for n in rows]
