"""llmc::QKVRoPE (llmc/plugins/qkv_rope) in a real ONNX Runtime session against the q/k norm and
rotary embedding written out in numpy, bad inputs refused; and the cpu lowering's fusion of a
layer's Split / RMSNorm / RotaryEmbedding / Reshape nodes into it (qkv_rope_rewrite.py), checked
by running the graph before and after in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.onnxruntime.rewrites.qkv_rope import OP_TYPE, fuse_qkv_rope
from llmc.plugins.paged_attention import ort_op
from llmc.runtime.runners.ort_env import session_options

pytestmark = pytest.mark.skipif(
    ort_op.library_path() is None, reason="the custom-op library is not built (no ORT header)"
)

H, G, D, EPS = 4, 1, 16, 1e-6


def expected(qkv, cos, sin, q_gamma, k_gamma):
    """Per token and head: RMS norm over D (float64), then the half-split rotation."""
    t = qkv.reshape(-1, (H + 2 * G), D).astype(np.float64)
    c = cos.reshape(-1, 1, D // 2).astype(np.float64)
    s = sin.reshape(-1, 1, D // 2).astype(np.float64)

    def norm_rope(x, gamma):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * gamma
        y1, y2 = y[..., : D // 2], y[..., D // 2 :]
        return np.concatenate([c * y1 - s * y2, s * y1 + c * y2], axis=-1)

    q = norm_rope(t[:, :H], q_gamma)
    k = norm_rope(t[:, H : H + G], k_gamma)
    v = t[:, H + G :]
    return [a.reshape(t.shape[0], -1) for a in (q, k, v)]


def session(m: onnx.ModelProto) -> ort.InferenceSession:
    opts = session_options(2)
    assert ort_op.register(opts)
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def make_model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializers,
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("llmc", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def gammas(rng) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, D).astype(np.float32), name)
        for name in ("q_gamma", "k_gamma")
    ]


def feeds(rng, tokens: int) -> dict[str, np.ndarray]:
    angles = rng.uniform(0, 6.3, (1, tokens, D // 2))
    return {
        "qkv": (rng.standard_normal((1, tokens, (H + 2 * G) * D)) * 3).astype(np.float32),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }


def op_model(rng, gamma_as_input: bool = False) -> onnx.ModelProto:
    node = helper.make_node(
        OP_TYPE,
        ["qkv", "cos", "sin", "q_gamma", "k_gamma"],
        ["q", "k", "v"],
        domain="llmc",
        num_heads=H,
        num_kv_heads=G,
        head_dim=D,
        epsilon=EPS,
    )
    inits = gammas(rng)
    inputs = ["qkv", "cos", "sin"]
    if gamma_as_input:
        inputs.append("q_gamma")
        inits = inits[1:]
    return make_model([node], inputs, ["q", "k", "v"], inits)


@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_op_matches_the_formula(tokens: int) -> None:
    rng = np.random.default_rng(tokens)
    m = op_model(rng)
    f = feeds(rng, tokens)
    got = session(m).run(None, f)
    q_gamma, k_gamma = (numpy_helper.to_array(t) for t in m.graph.initializer)
    for a, b in zip(got, expected(f["qkv"], f["cos"], f["sin"], q_gamma, k_gamma), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_gamma_that_is_not_an_initializer_is_refused() -> None:
    with pytest.raises(Exception, match="q_gamma must be a constant initializer"):
        session(op_model(np.random.default_rng(0), gamma_as_input=True))


def test_bad_widths_fail_the_run_and_the_session_goes_on() -> None:
    rng = np.random.default_rng(1)
    s = session(op_model(rng))
    f = feeds(rng, 3)
    with pytest.raises(Exception, match="last axis must be"):
        s.run(None, {**f, "qkv": f["qkv"][..., :-1]})
    with pytest.raises(Exception, match="cos and sin must be"):
        s.run(None, {**f, "cos": f["cos"][:, :2]})
    assert s.run(None, f)[0].shape == (3, H * D)


# ---- The rewrite ----------------------------------------------------------------------------


def const(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def layer_model(rng, second_reader: bool = False) -> onnx.ModelProto:
    """A layer's nodes as the optimized single graph holds them (head_layout's token-major q/k,
    the norms on llmc's op), ending in a PagedAttention node (never run here)."""
    nodes = [
        helper.make_node("Split", ["qkv", "sizes"], ["q0", "k0", "v0"], axis=-1),
        helper.make_node("Reshape", ["v0", "heads_kv"], ["v1"]),
        helper.make_node("Reshape", ["v1", "flat_kv"], ["v"]),
    ]
    for x, heads, gamma in (("q", H, "q_gamma"), ("k", G, "k_gamma")):
        shape, flat = ("heads_q", "flat_q") if x == "q" else ("heads_kv", "flat_kv")
        nodes += [
            helper.make_node("Reshape", [f"{x}0", shape], [f"{x}1"]),
            helper.make_node("RMSNorm", [f"{x}1", gamma], [f"{x}2"], domain="llmc", epsilon=EPS),
            helper.make_node("Reshape", [f"{x}2", f"rows_{x}"], [f"{x}3"]),
            helper.make_node(
                "RotaryEmbedding", [f"{x}3", "cos", "sin"], [f"{x}4"], num_heads=heads
            ),
            helper.make_node("Reshape", [f"{x}4", shape], [f"{x}5"]),
            helper.make_node("Reshape", [f"{x}5", flat], [x]),
        ]
    outputs = ["attn"]
    if second_reader:  # k's normed heads read twice: nothing may be fused
        nodes.append(helper.make_node("Identity", ["k2"], ["k2_copy"]))
        outputs.append("k2_copy")
    nodes.append(
        helper.make_node(
            "PagedAttention",
            ["q", "k", "v"],
            ["attn"],
            domain="llmc",
            num_heads=H,
            num_kv_heads=G,
            head_dim=D,
        )
    )
    inits = [
        const("sizes", [H * D, G * D, G * D]),
        const("heads_q", [1, -1, H, D]),
        const("heads_kv", [1, -1, G, D]),
        const("rows_q", [0, 0, H * D]),
        const("rows_k", [0, 0, G * D]),
        const("flat_q", [-1, H * D]),
        const("flat_kv", [-1, G * D]),
        *gammas(rng),
    ]
    return make_model(nodes, ["qkv", "cos", "sin"], outputs, inits)


def without_attention(m: onnx.ModelProto) -> onnx.ModelProto:
    """The graph up to PagedAttention's inputs, which become its outputs."""
    pa = next(n for n in m.graph.node if n.op_type == "PagedAttention")
    m.graph.node.remove(pa)
    del m.graph.output[:]
    m.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in pa.input
    )
    return m


def test_rewrite_fuses_a_layer_and_keeps_its_values() -> None:
    rng = np.random.default_rng(4)
    m = layer_model(rng)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert fuse_qkv_rope(fused) == 1
    assert [n.op_type for n in fused.graph.node] == [OP_TYPE, "PagedAttention"]
    # The shape constants of the removed nodes go with them (ORT warns of each one at load).
    read = {name for n in fused.graph.node for name in n.input}
    kept = {t.name for t in fused.graph.initializer}
    assert kept <= read and len(kept) < len(m.graph.initializer)
    f = feeds(rng, 7)
    before = session(without_attention(m)).run(None, f)
    after = session(without_attention(fused)).run(None, f)
    for a, b in zip(after, before, strict=True):
        np.testing.assert_allclose(a, b.reshape(a.shape), rtol=1e-5, atol=1e-5)


def test_rewrite_leaves_a_tensor_read_twice_alone() -> None:
    m = layer_model(np.random.default_rng(5), second_reader=True)
    before = [n.op_type for n in m.graph.node]
    assert fuse_qkv_rope(m) == 0
    assert [n.op_type for n in m.graph.node] == before
