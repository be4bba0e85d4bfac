"""TensorRT lint: a static check that an engine graph is parseable by TensorRT 11 in principle.

Run by every GPU-target build (before the portable stage is written, and again by
``llmc build --from STAGE``) and by ``llmc inspect``. It checks, node by node:

- opsets: the default domain within the parser's range; custom domains only ``llmc``;
- operators: each one in TensorRT's ONNX support table with a supported type on its data input,
  constant where the table says so, with the attribute values the table allows
  (``support_table.py`` cites the table);
- types: strict ONNX type inference over the whole graph (a strongly typed network has no
  implicit casts, so mixed float types at one node are errors);
- shapes: no shape input (Reshape's shape, Expand's, Slice's bounds, ...) computed from tensor
  data, e.g. from a NonZero output or from a graph input's values;
- Q/DQ (``lint_qdq.py``): symmetric, signed types, constant positive scales, INT4 weight-only and
  block-wise, per-tensor activations, FP8/FP4 only on targets that have them;
- microscaling (``lint_microscaling.py``): NVFP4 and MXFP8 as TensorRT's ``trt``-domain dynamic
  quantizers and two-level dequantization, their blocks, scales and targets;
- plugins (``lint_plugin.py``): every ``llmc::PagedAttention`` node complete;
- plugin I/O (``lint_plugin_io.py``): output count, aliased cache outputs, the AOT choice, every
  plugin field, string fields as the parser delivers them;
- kernels (``lint_kernel.py``): the AOT kernel's shared memory and PTX ISA on the target.

Each rule cites the TensorRT or onnx-tensorrt source it comes from beside its code.

Nothing here replaces TensorRT's parser: the lint has never been compared with a real parse.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from llmc.compiler.backends.tensorrt import support_table as st
from llmc.compiler.backends.tensorrt.lint_kernel import check_kernels
from llmc.compiler.backends.tensorrt.lint_microscaling import check_microscaling, type_standins
from llmc.compiler.backends.tensorrt.lint_ops import (
    check_ops,
    check_opsets,
    check_order,
    check_shape_inputs,
)
from llmc.compiler.backends.tensorrt.lint_plugin import check_plugins
from llmc.compiler.backends.tensorrt.lint_plugin_io import check_plugin_io
from llmc.compiler.backends.tensorrt.lint_qdq import check_qdq
from llmc.compiler.backends.tensorrt.lint_view import Finding, GraphView, op_key
from llmc.compiler.quantize.microscaling_graph import TRT_DOMAIN
from llmc.engine.plugin import DOMAIN, OP_TYPE
from llmc.errors import LlmcError
from llmc.plugins import schema


class TensorRTLintError(LlmcError):
    """The graph uses something TensorRT's ONNX parser does not accept (see the findings)."""


@dataclass
class LintReport:
    """All findings over one graph, with its op counts and the support table used."""

    findings: list[Finding] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    target: str | None = None
    source: str = st.SOURCE

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def passed(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        nodes = sum(self.op_counts.values())
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"TensorRT lint {verdict}: {nodes} nodes, {len(self.op_counts)} op types, "
            f"{len(self.errors)} errors, {len(self.warnings)} warnings (table: {self.source})"
        )

    def format(self) -> str:
        return "\n".join([self.summary(), *(f.format() for f in self.findings)])

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "target": self.target,
            "source": self.source,
            "op_counts": self.op_counts,
            "findings": [asdict(f) for f in self.findings],
        }


def lint_model(
    model: onnx.ModelProto, target: str | None = None, base_dir: Path | None = None
) -> LintReport:
    """Lint ``model`` for TensorRT on ``target`` (e.g. "sm90"; None skips per-arch checks).

    ``model`` may reference external data under ``base_dir``; only small tensors (scales, zero
    points, shape constants) are read. Returns the report; raises nothing for a bad graph.
    """
    schema.register_schema()
    report = LintReport(target=target)
    report.op_counts = dict(sorted(Counter(op_key(n) for n in model.graph.node).items()))
    findings = report.findings
    findings += check_opsets(model)
    findings += check_order(model)
    typed = _infer_types(model, findings)
    view = GraphView(model, base_dir, typed)
    findings += check_ops(view)
    findings += check_shape_inputs(view)
    findings += check_qdq(view, target)
    findings += check_microscaling(view, target)
    findings += check_plugins(view)
    findings += check_plugin_io(view)
    findings += check_kernels(view, target)
    return report


def lint_file(path: str | Path, target: str | None = None) -> LintReport:
    """``lint_model`` of a saved ONNX file, without loading its external weights."""
    path = Path(path)
    return lint_model(onnx.load(str(path), load_external_data=False), target, path.parent)


def raise_on_errors(report: LintReport, what: str) -> None:
    """Raise TensorRTLintError listing the errors of ``report`` about ``what``, if any."""
    if report.passed:
        return
    lines = "\n  ".join(f.format() for f in report.errors)
    raise TensorRTLintError(
        f"{what} fails the TensorRT lint ({len(report.errors)} errors):\n  {lines}\n"
        "TensorRT's ONNX parser would reject this graph; fix the model or the build options."
    )


def _infer_types(model: onnx.ModelProto, findings: list[Finding]) -> onnx.ModelProto:
    """Strict type inference on a light copy: large initializers become typed graph inputs,
    plugin nodes become Identity(q) for their output (same type and shape, DESIGN §3) and, on
    TensorRT graphs, Identity(cache) for the aliased cache outputs, and ``trt``-domain nodes
    Casts to their outputs' types (``lint_microscaling.type_standins``)."""
    g = model.graph
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    lg = light.graph
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    for t in g.initializer:
        small = t.data_location != onnx.TensorProto.EXTERNAL and t.ByteSize() < 4096
        if small:
            lg.initializer.append(t)
        else:
            lg.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for n in g.node:
        if n.domain == DOMAIN and n.op_type == OP_TYPE and n.input:
            sources = [n.input[0], *(n.input[i] for i in (3, 4) if i < len(n.input))]
            for i, (src, dst) in enumerate(zip(sources, n.output, strict=False)):
                if dst:
                    lg.node.append(helper.make_node("Identity", [src], [dst], f"{n.name}/{i}"))
        elif n.domain == TRT_DOMAIN:
            lg.node.extend(type_standins(n))
        else:
            lg.node.append(n)
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        msg = f"strict ONNX type inference failed: {e}"
        findings.append(Finding("error", "types", None, None, msg))
        return onnx.shape_inference.infer_shapes(light)
