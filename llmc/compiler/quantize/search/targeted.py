"""Quantization to ``--accuracy-target`` inside the build's quantize stage
(``pipeline.quantize``): the units of the graph, every module quantized in each format of its
ladder while its calibration statistics are in memory, the search (``search.search``) scored
on the float graph with those weights written in (``assignment_eval``), and the spec that
writes the chosen assignment.

Memory: every module is made once per format of its ladder below float (about 2 bytes per
parameter for fp8 -> 8-bit weight-only) and kept until the engine graph is written: in memory,
or, with a spill directory (a streamed build), on disk and memory-mapped, its pages read while a
scoring copies it into a segment and given back after (``segment_quantizer``). Measured on the
fp8 ``top1=0.95`` build of Gemma 3 270M, the search peaks at 2.72 GB with them on disk, 3.03 GB
with them in memory.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx_ir as ir

from llmc.calibration.observers import TensorStats
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.qdq import base_format, is_kv_key, kept_float
from llmc.compiler.quantize.search.accuracy_target import AccuracyTarget
from llmc.compiler.quantize.search.assignment import FLOAT, Unit, ladder_of, make_units
from llmc.compiler.quantize.search.assignment_eval import AssignmentScorer
from llmc.compiler.quantize.search.path_search import (
    Resume,
    Screening,
    SearchResult,
    search,
)
from llmc.compiler.quantize.tensor_spill import spill_linear
from llmc.quant.protocol import QuantizedLinear, QuantSpec

#: Calibration windows the per-unit sensitivities are scored on, at every k-th position (the
#: forward runs every token; the logits and their KL are taken at 1 in SENSITIVITY_STRIDE).
SENSITIVITY_WINDOWS = 4
SENSITIVITY_STRIDE = 4
#: Bytes per float weight of the compute dtype.
FLOAT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


class TargetedQuantization:
    """The state of one ``--accuracy-target`` quantization of ``graph`` (the ir model the
    engine's Q/DQ nodes are written into) for ``spec`` on target ``arch``; with ``spill_dir``
    the quantized modules' codes are written there as they are made (``spill_linear``)."""

    def __init__(
        self, graph: ir.Model, spec: QuantSpec, arch: str, dtype: str, spill_dir: Path | None = None
    ):
        self.graph, self.spec, self.float_bytes = graph, spec, FLOAT_BYTES[dtype]
        self.spill_dir = spill_dir
        self.targets = {t.module: t for t in find_targets(graph)}
        ladder = tuple(f for f in ladder_of(spec.quant) if f == FLOAT or FORMATS[f].runs_on(arch))
        quantized = {m: t for m, t in self.targets.items() if not kept_float(m, spec)}
        params = {m: t.shape[0] * t.shape[1] for m, t in quantized.items()}
        self.units: list[Unit] = make_units(
            params, {m: base_format(m, spec) for m in quantized}, ladder
        )
        # {module: the formats below float it may take}, made once per module and format
        self.needed: dict[str, set[str]] = {}
        for u in self.units:
            for rung in u.ladder[:-1]:
                for m, f in u.formats(rung).items():
                    if f != FLOAT:
                        self.needed.setdefault(m, set()).add(f)
        self.precomputed: dict[tuple[str, str], QuantizedLinear] = {}
        self.kv_stats: dict[str, TensorStats] = {}

    def add(self, stats: dict[str, TensorStats]) -> None:
        """Quantize the modules ``stats`` has statistics for in every format they may take;
        keep the KV-cache statistics."""
        self.kv_stats.update({k: s for k, s in stats.items() if is_kv_key(k)})
        self._quantize(stats, set(stats))

    def finish(self) -> None:
        """Quantize what is left (formats that need no statistics). Raises ValueError for a
        module whose format needs statistics that never came."""
        self._quantize({}, None)

    def _quantize(self, stats: dict[str, TensorStats], modules: set[str] | None) -> None:
        for module, formats in self.needed.items():
            if modules is not None and module not in modules:
                continue
            todo = [f for f in formats if (module, f) not in self.precomputed]
            if not todo:
                continue
            target = self.targets[module]
            weight = target.weight()
            for fmt in sorted(todo):
                if FORMATS[fmt].needs_stats and module not in stats:
                    raise ValueError(f"no calibration statistics for {module!r}")
                ql = FORMATS[fmt].quantize(weight, stats.get(module), self.spec)
                if self.spill_dir is not None:
                    ql = spill_linear(ql, self.spill_dir / f"target_{len(self.precomputed)}")
                self.precomputed[(module, fmt)] = ql
            del weight
            target.release()

    def search(
        self,
        target: AccuracyTarget,
        scorer: AssignmentScorer,
        progress,
        resume: Resume | None = None,
    ) -> SearchResult:
        """Run the search (``search.search``, resumed past a missed engine with ``resume``)
        with ``scorer``'s window sets "sensitivity" and "heldout"; ``progress(message)`` is
        told each scoring."""
        return search(
            target,
            self.units,
            self.float_bytes,
            lambda each: [r.mean_kl for r in scorer.score_each(each, "sensitivity")],
            lambda a: scorer.score(a, "heldout"),
            progress,
            resume,
            Screening(lambda a, n: scorer.screen(a, "heldout", n), len(scorer.windows["heldout"])),
        )

    def spec_for(self, result: SearchResult) -> QuantSpec:
        """``spec`` with the chosen assignment."""
        return replace(self.spec, assignment=result.assignment)
