"""Run an engine graph over many token windows one segment at a time, so that only one
segment's weights are ever loaded (calibration and the accuracy report of a build).

``OrtRunner.from_model`` loads every segment and runs one window through all of them; a build
that calibrates on 64 windows then holds the whole float model in ONNX Runtime. This runner
turns the loops around: segment 0 runs over every window, then plugin 0 over every window,
then segment 1, ... Between segments it keeps, per window, only the tensors a later segment or
plugin reads (the residual stream and the step's inputs: [T, hidden] float32 each), so memory
is one segment's weights plus ``windows x T x hidden`` activations, not the model. The
numbers are the same as ``OrtRunner.from_model``'s: the same segments (``split_at_plugins``),
session options and attention kernel, fed the same tensors; each window is one prefill step
(``single_prefill``) with its own KV cache of one layer.

With ``logits_rows``, the last segment runs once per that many logits positions of a window (its
layers after the last plugin recomputed each time), so a window's [T, V] logits are never whole
in memory: at a 262,144-token vocabulary, 256 positions' float32 logits are 0.27 GB per copy, and
ONNX Runtime holds several (the projection's output, the soft-capping's temporaries, the copy
returned).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from llmc.engine.kv_cache import kv_cache_numpy_dtype
from llmc.engine.plan import PluginCall
from llmc.engine.plugin import FPMATH_MODES
from llmc.engine.split import split_at_plugins
from llmc.plugins.paged_attention import ort_op
from llmc.runtime.runners.lora_feed import lora_feed, zero_slots
from llmc.runtime.runners.ort_runner import graph_session_options, run_plugin, step_feed
from llmc.runtime.runners.packed_weights import needs_packed_weights
from llmc.runtime.runners.step_inputs import StepInputs, single_prefill


@dataclass(frozen=True)
class SegmentEntry:
    """Where a run starts past segment 0: ``segment``'s index and, per window, the tensors live
    when it starts (recorded by an earlier run over the same windows, ``run``'s ``keep``)."""

    segment: int
    envs: list[dict[str, np.ndarray]]


@dataclass(frozen=True)
class Stream:
    """One of several runs over the same windows that share their segments' sessions
    (``LayerwiseRunner.run_streams``).

    Attributes:
        start: where it starts (None: segment 0, from the windows' step inputs).
        prepare: how it prepares its segments (None: the runner's).
        variant: ``variant(i)`` names the graph ``prepare`` makes of segment ``i``; streams
            whose variants of a segment are equal run one session of it (None: a variant of
            its own for every segment).
    """

    start: SegmentEntry | None = None
    prepare: Callable[[Any, str], Any] | None = None
    variant: Callable[[int], Hashable] | None = None


@dataclass(frozen=True)
class SegmentOutputs:
    """What one segment produced for one window.

    Attributes:
        segment: index of the segment (0 .. ``LayerwiseRunner.num_segments - 1``).
        window: index of the window; None for the record that closes the segment (it has run
            over every window and its weights are released: statistics of its tensors are
            complete, and memory is free for quantizing them).
        tensors: the ``extra_outputs`` this segment computes, and the logits [L, V] float32
            under ``LayerwiseRunner.logits`` for the last segment (unless the runner computes
            none); by tensor name (empty in the closing record).
        rows: for the last segment of a runner with ``logits_rows``, which of the window's
            logits positions (a slice of its ``logits_indices``, or of 0..T-1) these logits
            are: one record per chunk, in order. None: all of them (one record per window).
    """

    segment: int
    window: int | None
    tensors: dict[str, np.ndarray]
    rows: slice | None = None


class LayerwiseRunner:
    """Runs ``model`` (an ``onnx.ModelProto`` engine graph with plugin nodes, its weights in it
    or as external data in ``external_data_dir``) segment by segment over windows.

    Args:
        model: the engine graph.
        threads: ORT intra-op threads.
        extra_outputs: node outputs to return besides the logits (calibration's activations).
        external_data_dir: where external-data references are resolved.
        logits: compute the logits. Calibration reads none: without them each segment runs
            only the nodes its ``extra_outputs`` need, and the vocabulary projection (the
            largest weight of most models: 0.54 GB of float32 for Qwen2.5-0.5B) is never
            loaded.
        prepare: called as ``prepare(graph, file_name)`` on each segment's graph before its
            session is made; it may write external data to ``external_data_dir / file_name``
            (removed once the session has loaded it) and returns the graph to run. The build
            widens a float graph's 16-bit stored weights this way
            (``llmc.compiler.weights.stored_weights.widen_segment``).
        engine_kernels: optimize each segment as the CPU lowering does (ORT_ENABLE_ALL, so
            Q/DQ MatMuls fuse into the kernels an engine runs) with ``session_config``'s
            entries, instead of ORT_ENABLE_BASIC, and llmc's custom ops registered (where
            the library is built); for scoring quantized graphs as the engine would compute
            them.
        logits_rows: compute a window's logits at most this many positions per run of the
            last segment (records with ``rows``); None: all in one run. The last segment's
            ``extra_outputs`` then come with every chunk (the same values).

    Raises ValueError as ``split_at_plugins`` does (no plugin node, an unknown extra output),
    or for ``logits_rows`` below 1.
    """

    def __init__(
        self,
        model,
        threads: int | None = None,
        extra_outputs: tuple[str, ...] = (),
        external_data_dir: Path | None = None,
        logits: bool = True,
        prepare: Callable[[Any, str], Any] | None = None,
        engine_kernels: bool = False,
        session_config: Mapping[str, str] | None = None,
        logits_rows: int | None = None,
    ):
        if logits_rows is not None and logits_rows < 1:
            raise ValueError(f"logits_rows must be at least 1, got {logits_rows}")
        self._logits_rows = logits_rows
        self._segments, self.plan = split_at_plugins(model, extra_outputs=extra_outputs)
        self._engine_kernels, self._session_config = engine_kernels, dict(session_config or {})
        self._prepare = prepare
        self._extra = frozenset(extra_outputs)
        self._with_logits = logits
        self._threads, self._external_data_dir = threads, external_data_dir
        self.logits = self.plan.logits
        self.block_size = self.plan.plugins[0].block_size
        self._last_use = self._last_uses()
        self._lora = zero_slots(  # a LoRA graph's slots, empty: calibrated on the base model
            (i.name, [d.dim_value for d in i.type.tensor_type.shape.dim])
            for segment in self._segments
            for i in segment.graph.input
        )

    @property
    def num_segments(self) -> int:
        return len(self.plan.segments)

    def segment_of(self, name: str) -> int:
        """The index of the segment that outputs tensor ``name``. Raises KeyError if none
        does (not an ``extra_outputs`` or boundary tensor)."""
        for i, spec in enumerate(self.plan.segments):
            if name in spec.outputs:
                return i
        raise KeyError(name)

    def segment_to_run(self, i: int) -> tuple[Any, list[str], list[str]]:
        """(graph, inputs, outputs) of segment ``i`` as ``run`` runs it: without logits, the
        last segment pruned to the other outputs (``_pruned``), reading only what they need."""
        spec, segment = self.plan.segments[i], self._segments[i]
        if self._with_logits or self.logits not in spec.outputs:
            return segment, spec.inputs, spec.outputs
        outputs = [n for n in spec.outputs if n != self.logits]
        segment = _pruned(segment, outputs)
        read = {v.name for v in segment.graph.input}
        return segment, [n for n in spec.inputs if n in read], outputs

    def _last_uses(self) -> dict[str, int]:
        """Tensor name -> the last segment index after which it is read (a plugin after segment
        i counts as i)."""
        last: dict[str, int] = {}
        for i, spec in enumerate(self.plan.segments):
            for name in spec.inputs:
                last[name] = i
        for i, p in enumerate(self.plan.plugins):
            for name in p.inputs[:3]:
                last[name] = max(last.get(name, -1), i)
        return last

    def run(
        self,
        windows: list[np.ndarray],
        progress: Callable[[int, int], None] | None = None,
        logits_indices: list[np.ndarray] | None = None,
        prepare: Callable[[Any, str], Any] | None = None,
        prepacking: bool = True,
        attention_fpmath: str | None = None,
        start: SegmentEntry | None = None,
        keep: dict[int, SegmentEntry] | None = None,
    ) -> Iterator[SegmentOutputs]:
        """Yield each segment's outputs for each window, segment-major, each segment closed by a
        record with window None: (0, w0), (0, w1), ..., (0, None), (1, w0), ... ``windows``:
        [T] int64 token ids each (T >= 1). ``progress(done, total)`` counts segments.
        ``logits_indices``: per window, the positions ([L] int64) whose logits are computed
        (default: all T). ``prepare`` replaces the constructor's for this run (the graph is
        split once; each run may prepare its segments differently). ``prepacking=False`` keeps
        ONNX Runtime from packing copies of the weights with ``engine_kernels`` too (for a run
        of a float graph: MatMulNBits needs its packed weights). ``attention_fpmath`` (one of
        ``FPMATH_MODES``) replaces every plugin node's ``fpmath_mode`` for this run, so a float
        graph runs attention as an engine built from it will. ``start``: begin at its segment
        from its tensors (a run whose first segments are those of an earlier run: the
        accuracy-target search's one-unit scorings), yielding nothing for the segments before
        it. ``keep``: {segment index: None} to fill with each listed segment's ``SegmentEntry``
        (the arrays are shared, not copied, and outlive the run while held). Raises ValueError
        for no windows, an unknown ``attention_fpmath``, or a start of other windows."""
        run = self.run_streams(
            windows, [Stream(start, prepare)], progress, logits_indices, prepacking,
            attention_fpmath, keep,
        )  # fmt: skip
        for _, out in run:
            yield out

    def run_streams(
        self,
        windows: list[np.ndarray],
        streams: list[Stream],
        progress: Callable[[int, int], None] | None = None,
        logits_indices: list[np.ndarray] | None = None,
        prepacking: bool = True,
        attention_fpmath: str | None = None,
        keep: dict[int, SegmentEntry] | None = None,
    ) -> Iterator[tuple[int, SegmentOutputs]]:
        """``run`` of each of ``streams`` over the same ``windows``, interleaved segment by
        segment so that streams whose segment ``i`` is the same graph (equal ``variant(i)``)
        run one session of it: yields (stream index, ``SegmentOutputs``); within a segment each
        stream's windows come together, in order, and every stream that has started gets the
        segment's closing record. A search's one-module scorings, each quantized in one segment
        and float after it, make one session per segment and variant instead of one per scoring
        and segment. ``keep`` records the first stream's entries. Arguments and errors as
        ``run``'s."""
        if not windows:
            raise ValueError("no windows to run")
        steps: list[StepInputs] = [single_prefill(w, self.block_size) for w in windows]
        if logits_indices is not None:
            steps = [
                replace(step, logits_indices=np.asarray(rows, np.int64))
                for step, rows in zip(steps, logits_indices, strict=True)
            ]
        envs = [self._stream_envs(steps, stream.start) for stream in streams]
        first = [0 if stream.start is None else stream.start.segment for stream in streams]
        max_blocks = max(int(s.block_tables.shape[1]) for s in steps)
        # float segments run unpacked whatever ``prepacking`` says (``_session``)
        opts = (self._session_options(prepacking), self._session_options(False))
        plugins = self._plugins(attention_fpmath)
        for i in range(min(first), self.num_segments):
            if keep is not None and i in keep:
                keep[i] = SegmentEntry(i, [dict(env) for env in envs[0]])
            segment, inputs, outputs = self.segment_to_run(i)
            caches = _layer_caches(plugins[i], max_blocks) if i < len(plugins) else None
            started = [k for k in range(len(streams)) if first[k] <= i]
            for group in _variants(streams, started, i):
                prepare = streams[group[0]].prepare
                session = self._session(segment, i, opts, prepare) if outputs else None
                run = (session, inputs, outputs, plugins[i] if caches is not None else None, caches)
                for k in group:
                    for out in self._segment_windows(i, run, steps, envs[k]):
                        yield k, out
                del session, run
            del caches
            if progress is not None:
                progress(i + 1, self.num_segments)
            for k in started:
                yield k, SegmentOutputs(i, None, {})

    def _stream_envs(self, steps: list[StepInputs], start: SegmentEntry | None) -> list[dict]:
        """Each window's live tensors where a stream starts: its step inputs at segment 0, or
        copies of ``start``'s (checked to be of as many windows)."""
        if start is None:
            return [step_feed(step) | lora_feed(step, self._lora) for step in steps]
        if len(start.envs) != len(steps):
            raise ValueError(f"a start of {len(start.envs)} windows for {len(steps)}")
        return [dict(env) for env in start.envs]

    def _session_options(self, prepacking: bool):
        """The runs' ORT session options: the engine's optimizations and entries with
        ``engine_kernels``, packed weights only where those kernels need them."""
        opts = graph_session_options(self._threads, self._external_data_dir)
        # No packed copies of the weights: ONNX Runtime's MatMul would keep a packed copy of
        # each constant B beside the memory-mapped original (twice a segment's weights; 0.5 GB
        # more for a 151,936-word vocabulary projection). Packing per run costs little at
        # prefill sizes, and the numbers are the same.
        # Engine kernels pack their weights: MatMulNBits computes at its accuracy level (int8
        # activations at level 4) only from packed weights.
        if self._engine_kernels:
            import onnxruntime as ort

            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            ort_op.register(opts)  # llmc's kernels a prepared segment may run (BlockInt8MatMul)
        if not self._engine_kernels or not prepacking:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        for key, value in self._session_config.items():
            opts.add_session_config_entry(key, value)
        return opts

    def _segment_windows(self, i: int, run: tuple, steps: list[StepInputs], envs: list[dict]):
        """Segment ``i`` over one stream's windows (``envs``, updated in place, each left with
        only what a later segment or plugin reads): ``run`` is (its session or None, inputs,
        outputs, its plugin call or None, that layer's caches); yields each window's outputs."""
        session, inputs, outputs, plugin, caches = run
        for w, (step, env) in enumerate(zip(steps, envs, strict=True)):
            for rows, outs in self._window_runs(session, inputs, outputs, env):
                env.update(zip(outputs, outs, strict=True))
                del outs
                if plugin is not None:
                    env[plugin.output] = run_plugin(plugin, env, caches, step)
                tensors = {n: env[n] for n in outputs if n in self._extra or n == self.logits}
                yield SegmentOutputs(i, w, tensors, rows)
                del tensors
            # What no later segment or plugin reads goes now, not after every window's run:
            # a vocabulary projection's logits chunk per window held to the segment's end was
            # 16 x 67 MB (Gemma 3's held-out windows, 64 rows each).
            for name in [n for n in env if self._last_use.get(n, -1) <= i]:
                del env[name]

    def _plugins(self, fpmath_mode: str | None) -> list[PluginCall]:
        """The plan's plugin calls, each with ``fpmath_mode`` when given."""
        if fpmath_mode is None:
            return self.plan.plugins
        if fpmath_mode not in FPMATH_MODES:
            raise ValueError(f"attention_fpmath must be one of {FPMATH_MODES}, got {fpmath_mode!r}")
        return [replace(p, fpmath_mode=fpmath_mode) for p in self.plan.plugins]

    def _window_runs(self, session, inputs: list[str], outputs: list[str], env: dict):
        """Yield (rows, the ``outputs``' values) of each run of ``session`` for one window
        (its tensors in ``env``): one run with rows None, or with ``logits_rows`` and logits
        among the outputs, one run per chunk of the window's ``logits_indices``."""
        if session is None:
            yield None, []
            return
        feed = {n: env[n] for n in inputs}
        step = self._logits_rows
        if step is None or self.logits not in outputs or "logits_indices" not in feed:
            yield None, session.run(outputs, feed)
            return
        indices = feed["logits_indices"]
        for start in range(0, len(indices), step):
            feed["logits_indices"] = indices[start : start + step]
            rows = slice(start, start + len(feed["logits_indices"]))
            yield rows, session.run(outputs, feed)

    def _session(self, segment, i: int, opts: tuple, prepare=None):
        """Segment ``i`` prepared (``prepare``, else the runner's) in an ORT session with
        ``opts`` = (options for a quantized graph, options without packed weights). A graph
        whose kernels do not need packed weights (``needs_packed_weights``) takes the second:
        ORT's float MatMul gives the same numbers from the memory-mapped weights as from a
        packed copy, and the copy of a float vocabulary projection is 0.67 GB at Gemma 3's
        (a segment with an FP8 layer and the float projection held both)."""
        import onnxruntime as ort

        scratch = f"segment_{i:03d}.prepared.data"
        prepare = prepare or self._prepare
        if prepare is not None:
            segment = prepare(segment, scratch)
        quantized = needs_packed_weights(segment)
        try:
            return ort.InferenceSession(
                segment.SerializeToString(),
                opts[0] if quantized else opts[1],
                providers=["CPUExecutionProvider"],
            )
        finally:  # loaded (or mapped: the mapping outlives the name) by now
            if prepare is not None and self._external_data_dir is not None:
                (self._external_data_dir / scratch).unlink(missing_ok=True)


def _variants(streams: list[Stream], started: list[int], i: int) -> list[list[int]]:
    """The indices ``started`` of ``streams`` grouped by their variant of segment ``i``, each
    group in order, the groups in order of their first stream."""
    groups: dict[Hashable, list[int]] = {}
    for k in started:
        variant = streams[k].variant
        groups.setdefault((k,) if variant is None else ("variant", variant(i)), []).append(k)
    return list(groups.values())


def _layer_caches(plugin, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """One layer's (key, value) caches [num_blocks, block_size, KVH, D], reused by every
    window: a window's prefill writes its slots before its attention reads them."""
    shape = (num_blocks, plugin.block_size, plugin.num_kv_heads, plugin.head_dim)
    dtype = kv_cache_numpy_dtype(plugin.kv_cache_dtype)
    return np.zeros(shape, dtype), np.zeros(shape, dtype)


def _pruned(segment, outputs: list[str]):
    """A copy of ``segment`` (an ``onnx.ModelProto``) that computes only ``outputs``: the nodes
    none of them depends on, and the graph inputs and initializers only those nodes read, are
    dropped. Nodes are in topological order, so one backward pass finds the ones needed."""
    import onnx

    graph = segment.graph
    needed, keep = set(outputs), []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(n for n in node.input if n)
            needed.update(_subgraph_reads(node))
    pruned = onnx.ModelProto()
    pruned.CopyFrom(segment)
    g = pruned.graph
    for field, items in (
        ("node", list(reversed(keep))),
        ("initializer", [t for t in graph.initializer if t.name in needed]),
        ("input", [v for v in graph.input if v.name in needed]),
        ("output", [v for v in graph.output if v.name in outputs]),
        ("value_info", [v for v in graph.value_info if v.name in needed]),
    ):
        del getattr(g, field)[:]
        getattr(g, field).extend(items)
    return pruned


def _subgraph_reads(node) -> set[str]:
    """Names the subgraphs of ``node`` (If, Loop, Scan bodies) read, outer-scope ones
    included."""
    import onnx

    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            for inner in sub.node:
                names.update(n for n in inner.input if n)
                names.update(_subgraph_reads(inner))
    return names
