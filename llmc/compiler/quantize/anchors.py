"""Accuracy anchors: the accuracy report's measures for a quantization the user already knows,
scored on the same held-out windows as the engine, printed beside its report.

- A checkpoint from a GGUF file: llama.cpp's **Q8_0** of the same weights (``ggml_q8_0``) for
  every module the engine quantizes, the rest float. Its own stored types are named too: a
  Q4_K_M file's float weights *are* llama.cpp's Q4_K/Q6_K values, so against Q4_K_M the
  reference itself is the anchor (KL 0 by construction, not scored).
- Any other checkpoint: **round-to-nearest** of the same formats (per-channel/block scales
  from max |w|, no GPTQ, no AWQ search; SmoothQuant and activation ranges as the engine's), so
  the report shows what the calibration algorithms bought.

The anchors' weights are made while each segment's statistics are in memory (``add``), written
to disk as they are made in a streamed build (so its memory holds one layer's, not the model's:
a 3B model's round-to-nearest int4 codes are 3.3 GB as numpy arrays), and scored as assignments
(``assignment_eval.AssignmentScorer``) under keys ``"<anchor>:<format>"``.
Only weights are anchored: llama.cpp's own kernels (Q8 activations in its dot products) are not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import onnx_ir as ir

from llmc.calibration.observers import TensorStats
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.qdq import base_format, kept_float
from llmc.compiler.quantize.tensor_spill import spill_linear
from llmc.quant.ggml_q8_0 import QK8_0, quantize_q8_0
from llmc.quant.protocol import QuantizedLinear, QuantSpec

RTN = "rtn"
Q8_0 = "q8_0"
LABELS = {RTN: "round-to-nearest", Q8_0: "llama.cpp Q8_0"}
#: The format a Q8_0 anchor's Q/DQ runs as (block-wise 8-bit weight-only).
_Q8_0_FORMAT = "int8_weight_only"


@dataclass(frozen=True)
class SourceTypes:
    """The GGML types a GGUF checkpoint stores its tensors in: {type name: tensors}."""

    counts: dict[str, int]

    def describe(self) -> str:
        return ", ".join(f"{n} x{c}" for n, c in sorted(self.counts.items(), key=lambda x: -x[1]))


def gguf_source_types(path) -> SourceTypes:
    """The stored types of the GGUF file at ``path`` (its header only)."""
    from gguf import GGMLQuantizationType

    from llmc.compiler.frontend.gguf_file import check_gguf

    summary = check_gguf(path)
    counts = Counter(GGMLQuantizationType(t.ggml_type).name for t in summary.tensors)
    return SourceTypes(dict(counts))


class AnchorQuantization:
    """The anchors of one quantized build of ``graph`` with ``spec``: Q8_0 when the checkpoint
    came from GGUF (``gguf``: its ``SourceTypes``), else round-to-nearest. With ``spill_dir``
    (an existing directory) each anchor weight is written there as it is made and kept as a
    read-only memory map."""

    def __init__(
        self,
        graph: ir.Model,
        spec: QuantSpec,
        gguf: SourceTypes | None,
        spill_dir: Path | None = None,
    ):
        self.gguf, self.spill_dir = gguf, spill_dir
        self.name = Q8_0 if gguf is not None else RTN
        self.targets = {
            t.module: t for t in find_targets(graph) if not kept_float(t.module, spec)
        }  # fmt: skip
        self.rtn_spec = replace(spec, weight_rounding="nearest", int4_method="rtn", assignment=())
        self.formats = {
            m: (_Q8_0_FORMAT if self.name == Q8_0 else base_format(m, spec)) for m in self.targets
        }
        if self.name == Q8_0:  # llama.cpp quantizes whole blocks: other shapes stay float
            self.formats = {m: f for m, f in self.formats.items() if self._k(m) % QK8_0 == 0}
        self.precomputed: dict[tuple[str, str], QuantizedLinear] = {}

    def _k(self, module: str) -> int:
        return self.targets[module].shape[0]

    def key(self, module: str) -> str:
        """The scorer key of ``module``'s anchor weights: ``"<anchor>:<format>"``."""
        return f"{self.name}:{self.formats[module]}"

    def add(self, stats: dict[str, TensorStats]) -> None:
        """Make the anchor weights of the modules ``stats`` has statistics for."""
        self._make(stats, set(stats))

    def finish(self) -> None:
        """Make the rest (anchors that need no statistics)."""
        self._make({}, None)

    def _make(self, stats: dict[str, TensorStats], modules: set[str] | None) -> None:
        for module, fmt in self.formats.items():
            done = (module, self.key(module)) in self.precomputed
            if done or (modules is not None and module not in modules):
                continue
            fmt_obj = FORMATS[fmt]
            if self.name == RTN and fmt_obj.needs_stats and module not in stats:
                if modules is None:
                    raise ValueError(f"no calibration statistics for {module!r}")
                continue
            target = self.targets[module]
            if self.name == Q8_0:
                weight = target.weight()
                ql = QuantizedLinear(quantize_q8_0(weight), record={"format": "q8_0"})
            else:
                weight = target.weight_for(fmt_obj)
                ql = fmt_obj.quantize(weight, stats.get(module), self.rtn_spec)
            if self.spill_dir is not None:
                ql = spill_linear(ql, self.spill_dir / f"anchor_{len(self.precomputed)}")
            self.precomputed[(module, self.key(module))] = ql
            del weight  # no view of the memory-mapped weight may outlive its release
            target.release()

    def assignment(self) -> tuple[tuple[str, str], ...]:
        """The anchor as a scorer assignment: every anchored module under its key."""
        return tuple(sorted((m, self.key(m)) for m in self.formats))

    def record(self, report) -> dict:
        """The manifest's record of the anchor scored as ``report`` (an ``AccuracyReport``)."""
        out = {"name": self.name, "label": LABELS[self.name], "report": report.to_dict()}
        if self.gguf is not None:
            out["source_types"] = self.gguf.counts
        return out


def format_anchor(engine: dict, anchor: dict) -> str:
    """The engine's accuracy report (a dict) and its anchor record side by side."""
    a = anchor["report"]
    rows = [
        ("perplexity change", "perplexity_change", "{:+.3%}"),
        ("mean KL (nats)", "mean_kl", "{:.3g}"),
        ("top-1 agreement", "top1_agreement", "{:.2%}"),
    ]
    lines = [f"  {'':<18} {'engine':>12} {anchor['label']:>20}"]
    for title, key, fmt in rows:
        lines.append(f"  {title:<18} {fmt.format(engine[key]):>12} {fmt.format(a[key]):>20}")
    if "source_types" in anchor:
        types = ", ".join(f"{n} x{c}" for n, c in anchor["source_types"].items())
        lines.append(
            f"  the reference is the GGUF's own weights ({types}): llama.cpp's "
            "dequantized values, so its own format scores KL 0 against it"
        )
    return "\n".join(lines)
