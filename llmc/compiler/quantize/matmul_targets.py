"""Which MatMuls of an engine graph quantization applies to, under which names.

A target is a MatMul whose B is a constant 2-D weight [K, N]: an initializer, or the transpose
of one (a tied vocabulary projection reads the embedding table through a Transpose; it is
materialized as its own weight so it can be quantized while the embedding Gather keeps the
float table). Targets are named by the checkpoint module they came from (``lm_head``,
``model.layers.0.mlp.down_proj``, fused ``...self_attn.q_proj+k_proj+v_proj``), see
``llmc.compiler.passes.module_names``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from llmc.compiler.passes.module_names import NAME_SCOPES_KEY, module_name_from_scopes
from llmc.compiler.quantize.weight_columns import WeightColumns

LM_HEAD = "lm_head"


@dataclass(frozen=True)
class QuantTarget:
    """One quantizable MatMul.

    Attributes:
        node: the MatMul node (of the ``ir.Model`` it was found in).
        module: checkpoint module name (or the node name if the exporter recorded none).
        activation: name of the MatMul's A input, [..., K] float32.
        source: the constant holding the weight's values: [K, N], or [N, K] when ``transposed``.
        transposed: the MatMul reads ``source`` through a Transpose (a tied projection).
        is_lm_head: the vocabulary projection.
    """

    node: ir.Node
    module: str
    activation: str
    source: ir.TensorProtocol
    transposed: bool
    is_lm_head: bool

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the weight, read from the constant's header (no data is read)."""
        rows, cols = (int(d) for d in self.source.shape)
        return (cols, rows) if self.transposed else (rows, cols)

    def weight(self) -> np.ndarray:
        """The float32 weight [K, N] (a streamed graph's constant memory-mapped from its file;
        a transposed one as a transposed view, not copied)."""
        w = self.source.numpy()
        return w.T if self.transposed else w

    def weight_for(self, fmt) -> np.ndarray | WeightColumns:
        """The weight as ``fmt`` (a ``QuantFormat``) reads it: for a format that reads output
        channels a slice at a time (``reads_column_slices``) and a 16-bit stored weight, a
        ``WeightColumns`` (each slice widened when read), else ``weight()``."""
        stored = getattr(self.source, "stored", None)  # stored_weights.WidenedTensor
        if getattr(fmt, "reads_column_slices", False) and stored is not None:
            return WeightColumns(stored, self.transposed)
        return self.weight()

    def release(self) -> None:
        """Drop the constant's memory map or cached bytes (an external tensor's pages stay out
        of the process once its quantized copy is written)."""
        release = getattr(self.source, "release", None)
        if release is not None:
            release()


def _float_matrix(tensor: ir.TensorProtocol | None) -> bool:
    return tensor is not None and len(tensor.shape) == 2 and tensor.dtype == ir.DataType.FLOAT


def _constant_weight(value: ir.Value | None) -> tuple[ir.TensorProtocol, bool] | None:
    """The constant a MatMul's B reads and whether through a Transpose; None if not constant."""
    if value is None:
        return None
    if value.const_value is not None:
        return (value.const_value, False) if _float_matrix(value.const_value) else None
    producer = value.producer()
    if (
        producer is not None
        and producer.op_type == "Transpose"
        and producer.domain in ("", "ai.onnx")
    ):
        src = producer.inputs[0]
        perm = producer.attributes.get("perm")
        if src is not None and _float_matrix(src.const_value):
            if perm is None or list(perm.as_ints()) == [1, 0]:
                return src.const_value, True
    return None


def find_targets(model: ir.Model) -> list[QuantTarget]:
    """Every MatMul with a constant 2-D float32 weight, in graph order; no weight is read. The
    vocabulary projection is the one named ``lm_head``, or else the last target in the graph."""
    found: list[tuple[ir.Node, tuple[ir.TensorProtocol, bool]]] = []
    for node in model.graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        w = _constant_weight(node.inputs[1])
        if w is not None and node.inputs[0] is not None:
            found.append((node, w))
    names = [
        module_name_from_scopes(n.metadata_props.get(NAME_SCOPES_KEY)) or n.name or f"matmul_{i}"
        for i, (n, _) in enumerate(found)
    ]
    head = names.index(LM_HEAD) if LM_HEAD in names else len(found) - 1
    return [
        QuantTarget(n, name, n.inputs[0].name, *w, i == head)
        for i, ((n, w), name) in enumerate(zip(found, names, strict=True))
    ]


def is_excluded(module: str, patterns: tuple[str, ...]) -> bool:
    """``module`` matches one of the fnmatch ``patterns`` (``lm_head``, ``*.down_proj``,
    ``model.layers.0.*``)."""
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)
