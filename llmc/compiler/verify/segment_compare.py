"""Comparing one engine segment with the same segment of the unquantized graph (``llmc verify``).

Polygraphy's comparator (``OnnxrtRunner`` + ``Comparator.compare_accuracy``) compares the engine
segment, run on the unquantized graph's inputs of that segment, with the unquantized graph's
outputs of it: both captured from one reference run (``verify``'s, segment by segment), so the
reference never holds more than one segment's weights. ``match_names`` first re-matches engine
tensors the exporter named differently in another process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from llmc.runtime.runners.execution_provider import bind_provider
from llmc.runtime.runners.ort_env import session_options

# How much closer another tensor must be for an engine tensor to be re-matched (match_names).
_MATCH_MARGIN = 100.0


@dataclass(frozen=True)
class SegmentComparison:
    """Polygraphy's comparison of one engine segment with the unquantized segment.

    ``max_abs_error`` / ``max_rel_error`` are the largest over the compared outputs (relative to
    the reference); ``note`` says why a segment could not be compared (then ``passed`` is False).
    """

    index: int
    file: str
    outputs: tuple[str, ...]
    passed: bool
    max_abs_error: float
    max_rel_error: float
    note: str | None = None


def match_names(engine_env: dict, env: dict, names: tuple[str, ...]) -> dict[str, str]:
    """Engine tensor names whose value is another unquantized tensor's: {engine: reference}.

    The exporter does not always give a tensor the same name: Gemma 3 computes its two RoPE
    tables in ``set(layer_types)`` order, which follows Python's hash seed, so an engine built
    in another process can have the tables' names swapped. A name is re-matched when a tensor of
    the same shape and dtype is at least ``_MATCH_MARGIN`` times closer to the engine's values
    than the reference tensor of that name: quantization error cannot do that, a swap does (the
    swapped tensor is exact). ``engine_env`` / ``env``: every tensor at a segment boundary of
    the engine / the unquantized graph for one step, by name; ``names``: the engine's boundary
    tensors that the unquantized graph also computes.
    """
    mapping = {}
    for name in names:
        e, r = engine_env.get(name), env.get(name)
        if e is None or r is None:
            continue
        error = relative_error(e, r)
        if error == 0.0:
            continue
        candidates = [
            c for c, v in env.items() if c != name and v.shape == e.shape and v.dtype == e.dtype
        ]
        best = min(candidates, key=lambda c: relative_error(e, env[c]), default=None)
        if best is not None and relative_error(e, env[best]) * _MATCH_MARGIN < error:
            mapping[name] = best
    return mapping


def relative_error(a, b) -> float:
    """mean |a - b| / mean |b| (inf for different shapes)."""
    import numpy as np

    if a.shape != b.shape:
        return math.inf
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.abs(a - b).mean() / max(np.abs(b).mean(), 1e-30)) if a.size else 0.0


def _session(engine_file: Path, provider, threads: int):
    """The engine segment's session on ``provider``, as ``OrtRunner`` loads it."""
    import onnxruntime as ort

    opts = session_options(threads)
    if provider.optimize_at_build:  # as OrtRunner loads it: optimized at build time
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(engine_file), opts, providers=bind_provider(opts, provider))


def compare_segment(
    index: int,
    engine_dir: Path,
    spec,
    ref_spec,
    env: dict,
    renamed: dict[str, str],
    provider,
    *,
    threads: int,
    rtol: float,
    atol: float,
) -> SegmentComparison:
    """Run engine segment ``spec`` (file in ``engine_dir``, on ``provider``) through Polygraphy
    on the unquantized graph's inputs of it captured in ``env``, and compare its outputs with
    the unquantized segment's (``ref_spec``: a ``SegmentSpec``; its outputs in ``env`` too;
    names mapped through ``renamed``, see ``match_names``) at ``rtol`` / ``atol``. Never raises
    for a mismatch: a segment that cannot be compared is returned failed, with a note."""
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import (
        Comparator,
        IterationResult,
        SimpleCompareFunc,
    )
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    ref_of = {n: renamed.get(n, n) for n in [*spec.inputs, *spec.outputs]}
    outputs = tuple(o for o in spec.outputs if ref_of[o] in ref_spec.outputs)
    missing = [n for n in spec.inputs if ref_of[n] not in env]
    missing += [ref_of[o] for o in outputs if ref_of[o] not in env]
    note = None
    if missing:
        note = f"tensors not in the unquantized graph's run: {', '.join(missing[:3])}"
    elif len(outputs) < len(spec.outputs):
        lost = [o for o in spec.outputs if o not in outputs]
        note = f"outputs not in the unquantized graph: {', '.join(lost[:3])}"
    if note is not None:
        return SegmentComparison(index, spec.file, outputs, False, math.nan, math.nan, note)

    engine_sess = _session(engine_dir / spec.file, provider, threads)
    engine_name, ref_name = f"engine-segment-{index}", f"unquantized-segment-{index}"
    compare = SimpleCompareFunc(
        rtol=rtol,
        atol=atol,
        find_output_func=lambda name, _i, _result: [ref_of.get(name, name)],
    )
    reference = {ref_of[o]: env[ref_of[o]] for o in outputs}
    try:
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
            # A renamed tensor feeds the engine under its engine name.
            feed = {n: env[ref_of[n]] for n in spec.inputs}
            runner = OnnxrtRunner(lambda: engine_sess, name=engine_name)
            results = Comparator.run([runner], data_loader=[feed])
            results.append((ref_name, [IterationResult(reference, runner_name=ref_name)]))
            accuracy = Comparator.compare_accuracy(results, compare_func=compare)
    except PolygraphyException as e:
        return SegmentComparison(index, spec.file, outputs, False, math.nan, math.nan, str(e))
    per_output = accuracy[0][(engine_name, ref_name)][0]  # {output name: OutputCompareResult}
    return SegmentComparison(
        index,
        spec.file,
        outputs,
        bool(accuracy),
        max(r.max_absdiff for r in per_output.values()),
        max(r.max_reldiff for r in per_output.values()),
    )
