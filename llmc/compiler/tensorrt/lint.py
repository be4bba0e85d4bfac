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

from llmc.compiler.tensorrt import support_table as st
from llmc.errors import LlmcError
from llmc.plugins import schema


class TensorRTLintError(LlmcError):
    """The graph uses something TensorRT's ONNX parser does not accept (see the findings)."""


@dataclass(frozen=True)
class Finding:
    """One lint result: ``severity`` "error" | "warning"; ``check`` opset | graph | op | types |
    shape | qdq | int4 | block-dq | plugin | outputs | alias | aot | fields | strings | smem |
    ptx; the node's name and op type when it is about one node."""

    severity: str
    check: str
    node: str | None
    op: str | None
    message: str

    def format(self) -> str:
        where = f"{self.op} node {self.node!r}: " if self.node is not None else ""
        return f"{self.severity}: [{self.check}] {where}{self.message}"


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


class GraphView:
    """Read-only indexes over a graph the checks share: producers, consumers, constants, types.

    ``base_dir`` is where external tensor data lives (a saved model's directory); ``typed`` is
    the same graph after type inference (value types are read from it)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        base_dir: Path | None = None,
        typed: onnx.ModelProto | None = None,
    ):
        self.model = model
        self.base_dir = base_dir
        g = model.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.constant_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.types: dict[str, int] = {t.name: t.data_type for t in g.initializer}
        tg = typed.graph if typed is not None else g
        for vi in [*tg.input, *tg.value_info, *tg.output]:
            self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self.constant_nodes

    def array(self, name: str):
        """The value of a constant (initializer or Constant node) as numpy, or None."""
        from onnx import numpy_helper

        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name], base_dir=str(self.base_dir or ""))
        node = self.constant_nodes.get(name)
        if node is not None and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def type_name(self, name: str) -> str | None:
        t = self.types.get(name)
        return st.TYPE_NAMES.get(t, onnx.TensorProto.DataType.Name(t)) if t else None


def lint_model(
    model: onnx.ModelProto, target: str | None = None, base_dir: Path | None = None
) -> LintReport:
    """Lint ``model`` for TensorRT on ``target`` (e.g. "sm90"; None skips per-arch checks).

    ``model`` may reference external data under ``base_dir``; only small tensors (scales, zero
    points, shape constants) are read. Returns the report; raises nothing for a bad graph.
    """
    from llmc.compiler.tensorrt.lint_kernel import check_kernels
    from llmc.compiler.tensorrt.lint_ops import (
        check_ops,
        check_opsets,
        check_order,
        check_shape_inputs,
    )
    from llmc.compiler.tensorrt.lint_plugin import check_plugins
    from llmc.compiler.tensorrt.lint_plugin_io import check_plugin_io
    from llmc.compiler.tensorrt.lint_qdq import check_qdq

    schema.register_schema()
    report = LintReport(target=target)
    report.op_counts = dict(sorted(Counter(_op_key(n) for n in model.graph.node).items()))
    findings = report.findings
    findings += check_opsets(model)
    findings += check_order(model)
    typed = _infer_types(model, findings)
    view = GraphView(model, base_dir, typed)
    findings += check_ops(view)
    findings += check_shape_inputs(view)
    findings += check_qdq(view, target)
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


def _op_key(n: onnx.NodeProto) -> str:
    return f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type


def _infer_types(model: onnx.ModelProto, findings: list[Finding]) -> onnx.ModelProto:
    """Strict type inference on a light copy: large initializers become typed graph inputs and
    plugin nodes become Identity(q) for their output (same type and shape, DESIGN §3) and, on
    TensorRT graphs, Identity(cache) for the aliased cache outputs."""
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
        if n.domain == schema.DOMAIN and n.op_type == schema.OP_TYPE and n.input:
            sources = [n.input[0], *(n.input[i] for i in (3, 4) if i < len(n.input))]
            for i, (src, dst) in enumerate(zip(sources, n.output, strict=False)):
                if dst:
                    lg.node.append(helper.make_node("Identity", [src], [dst], f"{n.name}/{i}"))
        else:
            lg.node.append(n)
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        msg = f"strict ONNX type inference failed: {e}"
        findings.append(Finding("error", "types", None, None, msg))
        return onnx.shape_inference.infer_shapes(light)


def _node_finding(n: onnx.NodeProto, severity: str = "error"):
    def make(check: str, message: str) -> Finding:
        return Finding(severity, check, n.name, _op_key(n), message)

    return make
