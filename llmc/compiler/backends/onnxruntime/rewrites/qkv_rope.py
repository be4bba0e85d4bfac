"""Fuse the nodes between a decoder layer's QKV projection and its PagedAttention node into one
``llmc::QKVRoPE`` (cpu engines' single graph, after ``rewrites.rms_norm``).

Gemma 3 normalizes each q and k head (q_norm, k_norm) before the rotary embedding; the
optimized graph does it as ``Split`` of the fused projection's output, then per q and k
``Reshape`` -> ``llmc::RMSNorm`` -> ``Reshape`` -> ``RotaryEmbedding`` -> ``Reshape`` ->
``Reshape``, and two ``Reshape`` for v: 13 nodes per layer whose arithmetic is a few thousand
flops per token, each paying ONNX Runtime's dispatch and a pass over memory (together 0.93x
the prefill and decode steps of Gemma 3 270M once fused, benchmarks/RESULTS.md). The fused op
(``llmc/plugins/qkv_rope``) computes the same per head and token and writes PagedAttention's
q, k and v inputs. Matched strictly: every tensor on the way has one consumer, the split sizes
are the plugin node's H*D, KVH*D, KVH*D, the rotary embedding rotates whole heads in the
half-split form with cos and sin given per token, and both norms scale by a [D] initializer;
anything else is left alone. The shape arithmetic only the removed Reshapes read goes too.
Values agree with the unfused graph to float32 rounding.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from llmc.compiler.backends.onnxruntime.rewrites.node_attributes import attribute
from llmc.compiler.backends.onnxruntime.rewrites.rms_norm import PLAIN_OP as RMS_NORM
from llmc.engine.plugin import DOMAIN
from llmc.engine.plugin import OP_TYPE as PAGED_ATTENTION

OP_TYPE = "QKVRoPE"


class _Graph:
    """Producer and consumer lookups of a graph's tensors."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.uses: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                self.uses[name] = self.uses.get(name, 0) + 1
        for o in graph.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        self.initializers = {t.name: t for t in graph.initializer}

    def single_use_producer(self, name: str) -> onnx.NodeProto | None:
        """The node computing ``name`` if ``name`` has exactly one reader, else None."""
        return self.producer.get(name) if self.uses.get(name) == 1 else None

    def vector(self, name: str, length: int) -> bool:
        t = self.initializers.get(name)
        return t is not None and list(t.dims) == [length] and t.data_type == onnx.TensorProto.FLOAT


def _reshapes_up(g: _Graph, name: str, nodes: list[onnx.NodeProto]) -> tuple[str, onnx.NodeProto]:
    """Walk up from ``name`` through single-use Reshapes (appended to ``nodes``); the tensor
    reached and its producer (None when it has several readers or none)."""
    node = g.single_use_producer(name)
    while node is not None and node.op_type == "Reshape" and node.domain in ("", "ai.onnx"):
        nodes.append(node)
        name = node.input[0]
        node = g.single_use_producer(name)
    return name, node


def _head_chain(g: _Graph, name: str, heads: int, head_dim: int, nodes: list[onnx.NodeProto]):
    """From a q or k input of PagedAttention up to the Split output: Reshape*, RotaryEmbedding,
    Reshape*, RMSNorm, Reshape*. (split output, cos, sin, gamma, epsilon) or None."""
    _, rope = _reshapes_up(g, name, nodes)
    if rope is None or rope.op_type != "RotaryEmbedding" or rope.domain not in ("", "ai.onnx"):
        return None
    if len(rope.input) != 3 or attribute(rope, "interleaved", 0) != 0:
        return None
    if attribute(rope, "rotary_embedding_dim", 0) not in (0, head_dim):
        return None
    if attribute(rope, "num_heads", heads) not in (0, heads):
        return None
    nodes.append(rope)
    _, norm = _reshapes_up(g, rope.input[0], nodes)
    if norm is None or norm.op_type != RMS_NORM or norm.domain != DOMAIN:
        return None
    if not g.vector(norm.input[1], head_dim):
        return None
    nodes.append(norm)
    top, _ = _reshapes_up(g, norm.input[0], nodes)
    return top, rope.input[1], rope.input[2], norm.input[1], attribute(norm, "epsilon", 1e-5)


def _split_sizes(g: _Graph, split: onnx.NodeProto) -> list[int] | None:
    if len(split.input) < 2 or split.input[1] not in g.initializers:
        return None
    return [int(v) for v in numpy_helper.to_array(g.initializers[split.input[1]])]


def fuse_qkv_rope(model: onnx.ModelProto) -> int:
    """Replace, in ``model`` in place, each layer's Split / q-k norm / rotary / Reshape nodes
    between a QKV projection and its PagedAttention node by one ``llmc::QKVRoPE``; returns the
    number of layers fused."""
    graph = model.graph
    g = _Graph(graph)
    fused = []
    for pa in graph.node:
        if pa.op_type != PAGED_ATTENTION or pa.domain != DOMAIN or len(pa.input) < 3:
            continue
        heads = attribute(pa, "num_heads", 0)
        kv_heads = attribute(pa, "num_kv_heads", 0)
        head_dim = attribute(pa, "head_dim", 0)
        nodes: list[onnx.NodeProto] = []
        q = _head_chain(g, pa.input[0], heads, head_dim, nodes)
        k = _head_chain(g, pa.input[1], kv_heads, head_dim, nodes)
        v_top, split = _reshapes_up(g, pa.input[2], nodes)
        if q is None or k is None or split is None or split.op_type != "Split":
            continue
        if (q[1], q[2]) != (k[1], k[2]) or q[4] != k[4]:  # one cos/sin pair, one epsilon
            continue
        if list(split.output) != [q[0], k[0], v_top] or attribute(split, "axis", 0) != -1:
            continue
        sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        if _split_sizes(g, split) != sizes:
            continue
        node = helper.make_node(
            OP_TYPE,
            [split.input[0], q[1], q[2], q[3], k[3]],
            list(pa.input[:3]),
            name=f"{pa.name}/qkv_rope",
            domain=DOMAIN,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            epsilon=float(q[4]),
        )
        fused.append((pa, node, [split, *nodes]))
    for pa, node, removed in fused:
        for old in removed:
            graph.node.remove(old)
        graph.node.insert(list(graph.node).index(pa), node)
    if fused:
        _drop_dead_nodes(graph)
    return len(fused)


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove ONNX-domain nodes (no side effects) none of whose outputs is read, until none is
    left (the shape arithmetic that fed the fused Reshapes), then the initializers only they
    read (ONNX Runtime warns of each one left at every load)."""
    while True:
        used = {name for node in graph.node for name in node.input}
        used |= {o.name for o in graph.output}
        dead = [
            n
            for n in graph.node
            if n.domain in ("", "ai.onnx") and not any(o in used for o in n.output if o)
        ]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    unread = [t for t in graph.initializer if t.name not in used]
    for t in unread:
        graph.initializer.remove(t)
