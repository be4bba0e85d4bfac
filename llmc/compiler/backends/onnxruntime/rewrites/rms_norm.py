"""Run a cpu engine's RMS norms on llmc's kernel: ``llmc::SkipRMSNorm`` in place of ONNX
Runtime's ``com.microsoft.SkipSimplifiedLayerNormalization`` and ``llmc::RMSNorm`` in place of
its ``SimplifiedLayerNormalization``, in the engine's single graph.

The segments' ORT-optimized graphs hold ONNX Runtime's norm kernels (``skip_norm.py`` writes
them before ORT optimizes a segment); the single graph, which only runs with llmc's custom-op
library, gets ours: the same ``x / sqrt(mean(x^2) + eps) * gamma`` over the last axis (of the
residual sum ``a + b`` for the skip form, which it also returns), with the sum of squares in
float32 where ONNX Runtime's kernels differ in rounding, so the logits agree to float32
rounding rather than bit for bit. Why: at a 128-token prefill ONNX Runtime 1.31's skip form
takes ~100 us per [128, 640] call on a 2-core host and its plain form ~20 us, ours ~20 and
~10 (``llmc/plugins/rms_norm``); Gemma 3 has 6 norms per layer.

``fuse_norm_into_skip`` then joins a sublayer's own norm with the residual add and norm after it
(Gemma's post-attention and post-feedforward norms): ``llmc::NormSkipRMSNorm``, one pass over
each row instead of two ops, bit for bit the same.
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.compiler.backends.onnxruntime.rewrites.node_attributes import attribute
from llmc.engine.plugin import DOMAIN

PLAIN_OP = "RMSNorm"
SKIP_OP = "SkipRMSNorm"
NORM_SKIP_OP = "NormSkipRMSNorm"


def _used_outputs(node: onnx.NodeProto, used: set[str]) -> list[int]:
    return [i for i, name in enumerate(node.output) if name and name in used]


def rewrite_rms_norms(model: onnx.ModelProto) -> int:
    """Rewrite, in ``model`` in place, every float32 last-axis ``SimplifiedLayerNormalization``
    and every bias-free ``SkipSimplifiedLayerNormalization`` whose scale is a 1-D initializer
    and whose mean / inverse-deviation outputs nobody reads; returns the number rewritten."""
    graph = model.graph
    vectors = {t.name for t in graph.initializer if len(t.dims) == 1}
    used = {name for node in graph.node for name in node.input}
    used |= {o.name for o in graph.output}
    rewritten = 0
    for node in graph.node:
        outputs = _used_outputs(node, used)
        plain = (
            node.op_type == "SimplifiedLayerNormalization"
            and node.domain in ("", "ai.onnx")
            and len(node.input) == 2
            and attribute(node, "axis", -1) == -1
            and outputs == [0]
        )
        skip = (
            node.op_type == "SkipSimplifiedLayerNormalization"
            and node.domain == "com.microsoft"
            and len(node.input) == 3
            and set(outputs) <= {0, 3}
        )
        if not (plain or skip) or attribute(node, "stash_type", 1) != 1:
            continue
        if node.input[-1] not in vectors:
            continue
        epsilon = float(attribute(node, "epsilon", 1e-5))
        output = list(node.output)
        if skip:
            residual = output[3] if len(output) > 3 and output[3] else f"{node.name}/sum"
            output = [output[0], residual]
        else:
            output = [output[0]]
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("epsilon", epsilon))
        del node.output[:]
        node.output.extend(output)
        node.op_type = SKIP_OP if skip else PLAIN_OP
        node.domain = DOMAIN
        rewritten += 1
    if rewritten and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return rewritten


def fuse_norm_into_skip(model: onnx.ModelProto) -> int:
    """Fuse, in ``model`` in place, every ``llmc::RMSNorm`` whose output only one
    ``llmc::SkipRMSNorm`` reads (and no graph output) into that node: ``NormSkipRMSNorm`` with
    inputs (the skip's other input, the norm's input, the norm's gamma, the skip's gamma) and
    attributes ``epsilon_b`` (the norm's) and ``epsilon``. Returns the number fused."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    fused: list[onnx.NodeProto] = []
    for norm in graph.node:
        if norm.op_type != PLAIN_OP or norm.domain != DOMAIN or norm.output[0] in outputs:
            continue
        (skip, *others) = readers.get(norm.output[0], [None])
        if others or skip is None or skip.op_type != SKIP_OP or skip.domain != DOMAIN:
            continue
        if list(skip.input[:2]).count(norm.output[0]) != 1:
            continue
        residual = skip.input[1] if skip.input[0] == norm.output[0] else skip.input[0]
        epsilon = float(attribute(skip, "epsilon", 1e-5))
        inputs = [residual, norm.input[0], norm.input[1], skip.input[2]]
        del skip.input[:]
        skip.input.extend(inputs)
        del skip.attribute[:]
        skip.attribute.extend(
            [
                helper.make_attribute("epsilon_b", float(attribute(norm, "epsilon", 1e-5))),
                helper.make_attribute("epsilon", epsilon),
            ]
        )
        skip.op_type = NORM_SKIP_OP
        fused.append(norm)
    for norm in fused:
        graph.node.remove(norm)
    return len(fused)
