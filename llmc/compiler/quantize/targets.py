"""Which MatMuls of an engine graph quantization applies to, under which names.

A target is a MatMul whose B is a constant 2-D weight [K, N]: an initializer, or the transpose
of one (a tied vocabulary projection reads the embedding table through a Transpose; it is
materialized as its own weight so it can be quantized while the embedding Gather keeps the
float table). Targets are named by the checkpoint module they came from (``lm_head``,
``model.layers.0.mlp.down_proj``, fused ``...self_attn.q_proj+k_proj+v_proj``), see
``llmc.compiler.module_names``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from llmc.compiler.module_names import NAME_SCOPES_KEY, module_name_from_scopes

LM_HEAD = "lm_head"


@dataclass(frozen=True)
class QuantTarget:
    """One quantizable MatMul.

    Attributes:
        node: the MatMul node (of the ``ir.Model`` it was found in).
        module: checkpoint module name (or the node name if the exporter recorded none).
        activation: name of the MatMul's A input, [..., K] float32.
        weight: the float32 weight [K, N] as a numpy array (materialized if transposed).
        is_lm_head: the vocabulary projection.
    """

    node: ir.Node
    module: str
    activation: str
    weight: np.ndarray
    is_lm_head: bool


def _constant_weight(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        w = value.const_value.numpy()
        return w if w.ndim == 2 and w.dtype == np.float32 else None
    producer = value.producer()
    if (
        producer is not None
        and producer.op_type == "Transpose"
        and producer.domain in ("", "ai.onnx")
    ):
        src = producer.inputs[0]
        perm = producer.attributes.get("perm")
        if src is not None and src.const_value is not None and src.const_value.numpy().ndim == 2:
            if perm is None or list(perm.as_ints()) == [1, 0]:
                w = src.const_value.numpy()
                return np.ascontiguousarray(w.T) if w.dtype == np.float32 else None
    return None


def find_targets(model: ir.Model) -> list[QuantTarget]:
    """Every MatMul with a constant 2-D float32 weight, in graph order. The vocabulary projection
    is the one named ``lm_head``, or else the last target in the graph."""
    found: list[tuple[ir.Node, np.ndarray]] = []
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
        QuantTarget(n, name, n.inputs[0].name, w, i == head)
        for i, ((n, w), name) in enumerate(zip(found, names, strict=True))
    ]


def is_excluded(module: str, patterns: tuple[str, ...]) -> bool:
    """``module`` matches one of the fnmatch ``patterns`` (``lm_head``, ``*.down_proj``,
    ``model.layers.0.*``)."""
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)
