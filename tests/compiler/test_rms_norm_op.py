"""llmc::RMSNorm and llmc::SkipRMSNorm (llmc/plugins/rms_norm) in a real ONNX Runtime session:
against the RMS norm written out in numpy (float64) and against ONNX Runtime's own kernels on
the same inputs, bad inputs refused; and the cpu lowering's rewrite of ORT's norm nodes into
them (norm_rewrite.py), checked by running both graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.onnxruntime.rewrites.rms_norm import (
    NORM_SKIP_OP,
    PLAIN_OP,
    SKIP_OP,
    fuse_norm_into_skip,
    rewrite_rms_norms,
)
from llmc.plugins.paged_attention import ort_op
from llmc.runtime.runners.ort_env import session_options

pytestmark = pytest.mark.skipif(
    ort_op.library_path() is None, reason="the custom-op library is not built (no ORT header)"
)

EPS = 1e-6


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float = EPS) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * gamma over the last axis, in float64."""
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def model(nodes, inputs: list[str], outputs: list[str], gamma: np.ndarray, as_input=False):
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs]
    initializers = [numpy_helper.from_array(gamma, "gamma")]
    if as_input:
        values.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, list(gamma.shape)))
        initializers = []
    graph = helper.make_graph(
        nodes,
        "g",
        values,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializers,
    )
    opsets = [helper.make_opsetid(d, 1) for d in ("llmc", "com.microsoft")]
    opsets.append(helper.make_opsetid("", 21))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def session(m: onnx.ModelProto) -> ort.InferenceSession:
    opts = session_options(2)
    assert ort_op.register(opts)
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def plain_model(gamma: np.ndarray, as_input: bool = False) -> onnx.ModelProto:
    node = helper.make_node(PLAIN_OP, ["x", "gamma"], ["y"], domain="llmc", epsilon=EPS)
    return model([node], ["x"], ["y"], gamma, as_input)


def skip_model(gamma: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node(SKIP_OP, ["a", "b", "gamma"], ["y", "h"], domain="llmc", epsilon=EPS)
    return model([node], ["a", "b"], ["y", "h"], gamma)


@pytest.mark.parametrize("shape", [(1, 640), (7, 64), (2, 70, 3, 256), (0, 32)])
def test_rms_norm_matches_the_formula(shape) -> None:
    rng = np.random.default_rng(len(shape) * shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    y = session(plain_model(gamma)).run(None, {"x": x})[0]
    assert y.shape == shape and y.dtype == np.float32
    np.testing.assert_allclose(y, rms_norm(x, gamma), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows", [1, 16, 130])
def test_skip_rms_norm_returns_the_norm_of_the_sum_and_the_sum(rows: int) -> None:
    rng = np.random.default_rng(rows)
    a, b = (rng.standard_normal((1, rows, 96)).astype(np.float32) for _ in range(2))
    b[0, 0] *= 1e3  # a row of large values: the float32 sum of squares still holds
    gamma = rng.uniform(0.5, 1.5, 96).astype(np.float32)
    y, h = session(skip_model(gamma)).run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(h, a + b)
    np.testing.assert_allclose(y, rms_norm(a + b, gamma), rtol=2e-6, atol=2e-6)


def test_a_zero_row_normalizes_to_zero() -> None:
    gamma = np.ones(32, np.float32)
    y = session(plain_model(gamma)).run(None, {"x": np.zeros((2, 32), np.float32)})[0]
    np.testing.assert_array_equal(y, 0.0)


def test_a_gamma_that_is_not_an_initializer_is_refused() -> None:
    with pytest.raises(Exception, match="gamma must be a constant initializer"):
        session(plain_model(np.ones(8, np.float32), as_input=True))


def test_a_wrong_width_fails_the_run_and_the_session_goes_on() -> None:
    gamma = np.full(16, 2.0, np.float32)
    s = session(plain_model(gamma))
    with pytest.raises(Exception, match="last axis must be 16"):
        s.run(None, {"x": np.ones((3, 8), np.float32)})
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], rms_norm(x, gamma), rtol=2e-6)
    skip = session(skip_model(gamma))
    with pytest.raises(Exception, match="A and B must have the same shape"):
        skip.run(None, {"a": np.ones((3, 16), np.float32), "b": np.ones((2, 16), np.float32)})


# ---- The rewrite of ONNX Runtime's norm nodes ---------------------------------------------


def ort_norms_model(gamma: np.ndarray, stash_type: int = 1) -> onnx.ModelProto:
    """ORT's two norm kernels as the cpu lowering leaves them: h = x + r, y = norm(h) (skip
    form, h used again), q = norm(y) (plain form), out = q + h."""
    nodes = [
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["x", "r", "gamma"],
            ["y", "", "", "h"],
            domain="com.microsoft",
            epsilon=EPS,
        ),
        helper.make_node(
            "SimplifiedLayerNormalization",
            ["y", "gamma"],
            ["q"],
            axis=-1,
            epsilon=EPS,
            stash_type=stash_type,
        ),
        helper.make_node("Add", ["q", "h"], ["out"]),
    ]
    return model(nodes, ["x", "r"], ["out"], gamma)


def test_rewrite_puts_llmc_norms_in_place_and_keeps_the_result() -> None:
    rng = np.random.default_rng(5)
    gamma = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    feeds = {n: rng.standard_normal((1, 9, 64)).astype(np.float32) for n in ("x", "r")}
    m = ort_norms_model(gamma)
    before = session(m).run(None, feeds)[0]
    assert rewrite_rms_norms(m) == 2
    assert [(n.domain, n.op_type) for n in m.graph.node] == [
        ("llmc", SKIP_OP),
        ("llmc", PLAIN_OP),
        ("", "Add"),
    ]
    assert list(m.graph.node[0].output) == ["y", "h"]
    after = session(m).run(None, feeds)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    h = feeds["x"] + feeds["r"]
    np.testing.assert_allclose(after, rms_norm(rms_norm(h, gamma), gamma) + h, rtol=1e-5)


def test_rewrite_leaves_other_norms_alone() -> None:
    gamma = np.ones(8, np.float32)
    m = ort_norms_model(gamma, stash_type=0)  # the plain norm stashed in another precision
    m.graph.node[0].output[1] = "mean"  # the skip norm's mean is read
    m.graph.node.append(helper.make_node("Identity", ["mean"], ["mean_out"]))
    before = [(n.domain, n.op_type) for n in m.graph.node]
    assert rewrite_rms_norms(m) == 0
    assert [(n.domain, n.op_type) for n in m.graph.node] == before


# ---- A sublayer's norm fused into the residual add and norm after it ----------------------


def post_norm_model(gamma_b: np.ndarray, gamma: np.ndarray, norm_first: bool) -> onnx.ModelProto:
    """Gemma's post-sublayer norm, then the residual add and the next pre-norm, as llmc ops:
    n = norm(b, gamma_b) (epsilon 1e-5); y, h = SkipRMSNorm(n, a) or (a, n) (epsilon EPS)."""
    norm = helper.make_node(PLAIN_OP, ["b", "gamma_b"], ["n"], domain="llmc", epsilon=1e-5)
    skip_inputs = ["n", "a", "gamma"] if norm_first else ["a", "n", "gamma"]
    skip = helper.make_node(SKIP_OP, skip_inputs, ["y", "h"], domain="llmc", epsilon=EPS)
    m = model([norm, skip], ["a", "b"], ["y", "h"], gamma)
    m.graph.initializer.append(numpy_helper.from_array(gamma_b, "gamma_b"))
    return m


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("rows", [1, 16, 130])
def test_norm_skip_equals_the_two_ops_bit_for_bit(rows: int, norm_first: bool) -> None:
    rng = np.random.default_rng(rows)
    a, b = (rng.standard_normal((1, rows, 640)).astype(np.float32) for _ in range(2))
    b *= 40.0  # a sublayer output far from unit scale, as Gemma's are
    gamma_b, gamma = (rng.uniform(0.5, 1.5, 640).astype(np.float32) for _ in range(2))
    m = post_norm_model(gamma_b, gamma, norm_first)
    feeds = {"a": a, "b": b}
    y0, h0 = session(m).run(None, feeds)

    assert fuse_norm_into_skip(m) == 1

    assert [(n.domain, n.op_type) for n in m.graph.node] == [("llmc", NORM_SKIP_OP)]
    assert list(m.graph.node[0].input) == ["a", "b", "gamma_b", "gamma"]
    y, h = session(m).run(None, feeds)
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_allclose(h, a + rms_norm(b, gamma_b, 1e-5), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y, rms_norm(h, gamma), rtol=2e-6, atol=2e-6)


def test_a_norm_read_elsewhere_is_not_fused() -> None:
    gamma = np.ones(8, np.float32)
    m = post_norm_model(gamma, gamma, norm_first=True)
    m.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    assert fuse_norm_into_skip(m) == 0
    assert [n.op_type for n in m.graph.node] == [PLAIN_OP, SKIP_OP]


def test_norm_skip_refuses_gammas_of_two_lengths() -> None:
    m = post_norm_model(np.ones(8, np.float32), np.ones(8, np.float32), norm_first=True)
    fuse_norm_into_skip(m)
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones(4, np.float32), "gamma_b"))
    with pytest.raises(Exception, match="gamma_b and gamma must have one length"):
        session(m)
