"""What the TensorRT lint's rules share: ``Finding``, the ``GraphView`` over a graph, and
``node_finding`` (one finding about one node). The rules (``lint_*.py``) import this module and
``lint.py`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from llmc.compiler.backends.tensorrt import support_table as st


@dataclass(frozen=True)
class Finding:
    """One lint result: ``severity`` "error" | "warning"; ``check`` opset | graph | op | types |
    shape | qdq | int4 | block-dq | microscaling | plugin | outputs | alias | aot | fields |
    strings | smem | ptx; the node's name and op type when it is about one node."""

    severity: str
    check: str
    node: str | None
    op: str | None
    message: str

    def format(self) -> str:
        where = f"{self.op} node {self.node!r}: " if self.node is not None else ""
        return f"{self.severity}: [{self.check}] {where}{self.message}"


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
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name], base_dir=str(self.base_dir or ""))
        node = self.constant_nodes.get(name)
        if node is not None and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def type_name(self, name: str) -> str | None:
        t = self.types.get(name)
        return st.TYPE_NAMES.get(t, onnx.TensorProto.DataType.Name(t)) if t else None


def op_key(n: onnx.NodeProto) -> str:
    """The op's name in reports: ``domain::OpType`` outside the default domain."""
    return f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type


def node_finding(n: onnx.NodeProto, severity: str = "error"):
    """A maker of findings about node ``n`` of ``severity``: ``make(check, message)``."""

    def make(check: str, message: str) -> Finding:
        return Finding(severity, check, n.name, op_key(n), message)

    return make
