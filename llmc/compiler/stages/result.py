"""``BuildResult``: what ``llmc build`` produced, and its summary for the terminal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmc.calibration.accuracy import AccuracyReport
from llmc.registry.index import IndexEntry


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: where, the pass report, and the optimized graph's op counts;
    for quantized builds the quantization record and the accuracy report; with ``--registry``
    the registry's entry and root."""

    engine_dir: Path
    pass_report: dict[str, int]
    optimized_ops: dict[str, int]
    quantization: dict | None = None
    accuracy_report: AccuracyReport | None = None
    registry_entry: IndexEntry | None = None
    registry: str | None = None

    def format(self) -> str:
        """The build's summary: passes, what was quantized and which fused kernels run it, the
        accuracy report, the engine directory and where it was published."""
        lines = ["passes: " + ", ".join(f"{k}={v}" for k, v in self.pass_report.items())]
        if self.quantization is not None:
            counts = ", ".join(f"{k}={v}" for k, v in self.quantization["counts"].items())
            fast = ", ".join(
                f"{op} {r['found']}/{r['expected']}" + _runs_as(r.get("runs_as", {}))
                for op, r in self.quantization.get("fast_path", {}).items()
            )
            recipe = self.quantization.get("spec", {}).get("recipe")
            named = f" (recipe {recipe})" if recipe else ""
            lines.append(f"quantized{named}: {counts}; fused kernels: {fast}")
            record = self.quantization.get("spec", {}).get("accuracy_target")
            if record is not None:
                from llmc.compiler.quantize.search.path_search import format_record

                lines.append(format_record(record))
        if self.accuracy_report is not None:
            lines.append(self.accuracy_report.format())
            anchor = (self.quantization or {}).get("spec", {}).get("anchor")
            if anchor is not None:
                from llmc.compiler.quantize.anchors import format_anchor

                lines.append(format_anchor(self.accuracy_report.to_dict(), anchor))
        lines.append(f"engine: {self.engine_dir}")
        if self.registry_entry is not None:
            entry = self.registry_entry
            lines.append(f"published: {entry.model_id}@{entry.short_id} in {self.registry}")
        return "\n".join(lines)


def _runs_as(kernels: dict[str, int]) -> str:
    """`` (engine.onnx runs 73 as BlockInt8MatMul)`` for a fused kernel llmc's replaces."""
    if not kernels:
        return ""
    return " (engine.onnx runs " + ", ".join(f"{n} as {op}" for op, n in kernels.items()) + ")"
