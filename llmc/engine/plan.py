"""The execution plan of a segmented CPU engine: ``plan.json`` (DESIGN §6).

ONNX Runtime runs every node except ``llmc::PagedAttention``; the plugin runs as the CPU kernel
between two segments, on the runner's KV cache by reference. A step is: segment 0, plugin 0,
segment 1, ..., plugin L-1, segment L (``llmc.engine.split`` cuts a graph this way).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmc.engine.files import PLAN_NAME
from llmc.engine.plugin import (
    FPMATH_ATTRIBUTE,
    PluginAttributes,
    node_attribute_values,
    node_fpmath_mode,
)


@dataclass(frozen=True, kw_only=True)
class PluginCall(PluginAttributes):
    """One PagedAttention node: its attributes (``PluginAttributes``), its 9 input names
    (DESIGN §3 order) and its output name. The optional attributes' defaults let a plan.json
    written before them load unchanged. ``fpmath_mode`` is the CPU kernel's node attribute
    outside the plugin contract (``llmc.engine.plugin.FPMATH_ATTRIBUTE``)."""

    inputs: list[str] = field(default_factory=list)
    output: str = ""
    fpmath_mode: str = "strict"

    @classmethod
    def from_node(cls, node) -> PluginCall:
        """The call of an ``onnx.NodeProto``. Raises LlmcError for a missing attribute or a bad
        ``fpmath_mode``."""
        return cls(
            inputs=list(node.input),
            output=node.output[0],
            fpmath_mode=node_fpmath_mode(node),
            **node_attribute_values(node),
        )

    def cpu_node_attributes(self) -> dict[str, object]:
        """The node's attributes as a CPU engine's graph carries them: the plugin's
        (``node_attributes``), then ``fpmath_mode`` unless "strict"."""
        extra = {} if self.fpmath_mode == "strict" else {FPMATH_ATTRIBUTE: self.fpmath_mode}
        return {**self.node_attributes(), **extra}


@dataclass(frozen=True)
class SegmentSpec:
    """One ORT segment: its file (relative to the engine dir) and its boundary tensor names."""

    file: str
    inputs: list[str]
    outputs: list[str]


@dataclass(frozen=True)
class ExecutionPlan:
    """How a runner executes the engine: segment i, then plugin i, for every i; logits last.

    ``graph`` names the same step as one graph with the plugin nodes in place
    (``single_graph.py``; "" for an engine built without one), which a runner with the
    PagedAttention ORT custom op runs instead of the segments.
    """

    segments: list[SegmentSpec]
    plugins: list[PluginCall]
    logits: str
    graph: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ExecutionPlan:
        d = json.loads(text)
        return cls(
            segments=[SegmentSpec(**s) for s in d["segments"]],
            plugins=[PluginCall(**p) for p in d["plugins"]],
            logits=d["logits"],
            graph=d.get("graph", ""),
        )


def save_plan(plan: ExecutionPlan, engine_dir: Path) -> None:
    """Write ``plan.json`` into ``engine_dir``."""
    (engine_dir / PLAN_NAME).write_text(plan.to_json())


def load_plan(engine_dir: Path) -> ExecutionPlan:
    """Read ``plan.json`` from ``engine_dir``."""
    return ExecutionPlan.from_json((engine_dir / PLAN_NAME).read_text())
