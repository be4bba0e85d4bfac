"""llmc::BlockInt8MatMul (llmc/plugins/int8_matmul) in a real ONNX Runtime session: against the
arithmetic its header defines (written out here in numpy), against ONNX Runtime's own
MatMulNBits at accuracy level 4 on the same inputs, bad inputs refused; and the cpu lowering's
rewrite of 8-bit MatMulNBits nodes (int8_matmul_rewrite.py)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import OP_TYPE, rewrite_block_int8
from llmc.engine.isa import detect_host_isa
from llmc.plugins.paged_attention import ort_op
from llmc.runtime.runners.ort_env import session_options

pytestmark = pytest.mark.skipif(
    ort_op.library_path() is None, reason="the custom-op library is not built (no ORT header)"
)


def weights(rng, k: int, n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' 8-bit weight: codes [n, k / block, block] uint8 (zero point 128), scales
    [n * k / block] float32, every code of the grid used (0 and 255 included)."""
    codes = rng.integers(0, 256, (n, k // block, block), dtype=np.uint8)
    codes[0, 0, :2] = (0, 255)
    scales = rng.uniform(1e-3, 2e-2, n * (k // block)).astype(np.float32)
    return codes, scales


def expected(a: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """y = sum over blocks g of sa[m, g] * sw[n, g] * (qa[m, g, :] . (codes[n, g, :] - 128)),
    qa = round_half_even(a * (1 / sa)), sa = max |a| over the block / 127 (0 -> qa = 0)."""
    n, num_blocks, block = codes.shape
    rows = a.reshape(-1, num_blocks, block).astype(np.float32)
    sa = np.abs(rows).max(axis=2) / np.float32(127)
    inverse = np.divide(np.float32(1), sa, out=np.zeros_like(sa), where=sa != 0)
    qa = np.rint(rows * inverse[:, :, None]).astype(np.int64)
    qw = codes.astype(np.int64) - 128
    dots = np.einsum("mgk,ngk->mgn", qa, qw).astype(np.float64)
    sw = scales.reshape(n, num_blocks).T.astype(np.float64)
    y = (dots * sa[:, :, None] * sw[None]).sum(axis=1)
    return y.reshape(*a.shape[:-1], n)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form (Hendrycks & Gimpel 2016), in float64."""
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def one_node_model(
    codes,
    scales,
    op_type: str = OP_TYPE,
    weight_as_input: bool = False,
    input_gate: str = "",
    output_gate: str = "",
):
    n, num_blocks, block = codes.shape
    k = num_blocks * block
    domain = "llmc" if op_type == OP_TYPE else "com.microsoft"
    attrs = dict(K=k, N=n, bits=8, block_size=block)
    if input_gate:
        attrs["input_gate"] = input_gate
    if output_gate:
        attrs["output_gate"] = output_gate
    if op_type != OP_TYPE:
        attrs["accuracy_level"] = 4
    node = helper.make_node(op_type, ["a", "b", "scales"], ["y"], domain=domain, **attrs)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)]  # any rank and width
    initializers = [numpy_helper.from_array(scales, "scales")]
    if weight_as_input:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.UINT8, list(codes.shape)))
    else:
        initializers.append(numpy_helper.from_array(codes, "b"))
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = session_options(2)
    assert ort_op.register(opts)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("m", "k", "n", "block"),
    [
        (1, 256, 64, 128),
        (7, 512, 100, 128),
        (13, 96, 70, 32),
        (130, 640, 130, 16),
        (6, 8, 3, 4),
        (70, 256, 100, 128),  # the AMX path where the host has it: 32 + 32 + 16 rows, padded
        (16, 256, 100, 128),  # the AMX path's fewest rows: one 16-row tile
        (32, 128, 64, 64),
        (16, 640, 16384, 32),  # 16 rows over a 10 MB weight: the tiles' next-panel prefetch
    ],
)
def test_matches_the_defined_arithmetic(m: int, k: int, n: int, block: int) -> None:
    rng = np.random.default_rng(m * k + n)
    codes, scales = weights(rng, k, n, block)
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[:, 1] *= 40  # an outlier channel: its blocks get their own scale
    a[0, :block] = 0  # an all-zero block (scale 0)
    y = session(one_node_model(codes, scales)).run(None, {"a": a})[0]
    ref = expected(a, codes, scales)
    assert y.shape == (m, n) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_matches_onnx_runtime_matmulnbits_on_batched_input() -> None:
    rng = np.random.default_rng(0)
    codes, scales = weights(rng, 1024, 192, 128)
    a = rng.standard_normal((2, 9, 1024)).astype(np.float32)
    ours = session(one_node_model(codes, scales)).run(None, {"a": a})[0]
    theirs = session(one_node_model(codes, scales, "MatMulNBits")).run(None, {"a": a})[0]
    assert ours.shape == (2, 9, 192)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max())


def test_a_weight_that_is_not_an_initializer_is_refused() -> None:
    codes, scales = weights(np.random.default_rng(1), 64, 16, 32)
    with pytest.raises(Exception, match="B must be a constant initializer"):
        session(one_node_model(codes, scales, weight_as_input=True))


def test_a_wrong_input_width_fails_the_run_and_the_session_goes_on() -> None:
    rng = np.random.default_rng(2)
    codes, scales = weights(rng, 64, 16, 32)
    s = session(one_node_model(codes, scales))
    with pytest.raises(Exception, match="last dimension must be 64"):
        s.run(None, {"a": np.ones((3, 32), np.float32)})
    a = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(
        s.run(None, {"a": a})[0], expected(a, codes, scales), rtol=1e-5, atol=1e-4
    )


def test_gelu_tanh_gate_input_is_the_product_of_gelu_gate_and_up() -> None:
    rng = np.random.default_rng(6)
    codes, scales = weights(rng, 256, 80, 64)
    gate_up = (rng.standard_normal((17, 512)) * 3).astype(np.float32)
    gated = session(one_node_model(codes, scales, input_gate="gelu_tanh"))
    y = gated.run(None, {"a": gate_up})[0]
    product = (gelu_tanh(gate_up[:, :256]) * gate_up[:, 256:]).astype(np.float32)
    ref = expected(product, codes, scales)
    # a code may round the other way where GELU's float32 evaluation differs in the last bit
    np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    with pytest.raises(Exception, match=r"must be 512 \(K=256, gated: 2K\)"):
        gated.run(None, {"a": product})


def test_bad_attributes_are_refused() -> None:
    codes, scales = weights(np.random.default_rng(3), 64, 16, 32)
    model = one_node_model(codes, scales)
    for attr in model.graph.node[0].attribute:
        if attr.name == "bits":
            attr.i = 4
    with pytest.raises(Exception, match="needs bits=8"):
        session(model)
    with pytest.raises(Exception, match="input_gate must be"):
        session(one_node_model(codes, scales, input_gate="silu"))
    with pytest.raises(Exception, match="output_gate must be"):
        session(one_node_model(codes, scales, output_gate="silu"))
    with pytest.raises(Exception, match="output_gate needs N a multiple of 128"):
        session(one_node_model(codes, scales, output_gate="gelu_tanh"))  # N = 16


@pytest.mark.parametrize("m", [1, 7, 20, 70])  # the VNNI tiles; 20, 70: AMX where it runs
def test_gelu_tanh_output_gate_is_gelu_of_the_gate_half_times_the_up_half(m: int) -> None:
    """output_gate: Y = gelu_tanh(Y_full[:, :N/2]) * Y_full[:, N/2:], Y_full the plain op's
    output (the same tiles), with the GELU in float32 as the input gate computes it."""
    rng = np.random.default_rng(m)
    codes, scales = weights(rng, 256, 256, 128)
    a = rng.standard_normal((m, 256)).astype(np.float32)
    full = session(one_node_model(codes, scales)).run(None, {"a": a})[0]
    gated = session(one_node_model(codes, scales, output_gate="gelu_tanh")).run(None, {"a": a})[0]
    assert gated.shape == (m, 128)
    ref = gelu_tanh(full[:, :128]) * full[:, 128:]
    np.testing.assert_allclose(gated, ref, rtol=2e-6, atol=1e-6 * np.abs(ref).max())
    exact = gelu_tanh(expected(a, codes, scales)[:, :128]) * expected(a, codes, scales)[:, 128:]
    np.testing.assert_allclose(gated, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_rewrite_replaces_8_bit_nodes_only_and_keeps_the_result() -> None:
    rng = np.random.default_rng(4)
    codes, scales = weights(rng, 256, 48, 64)
    model = one_node_model(codes, scales, "MatMulNBits")
    four_bit = helper.make_node(
        "MatMulNBits", ["a", "b4", "s4"], ["y4"], domain="com.microsoft",
        K=256, N=8, bits=4, block_size=64,
    )  # fmt: skip
    model.graph.node.append(four_bit)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(rng.integers(0, 256, (8, 4, 32), dtype=np.uint8), "b4"),
            numpy_helper.from_array(np.full(32, 0.01, np.float32), "s4"),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("y4", TensorProto.FLOAT, None))
    a = rng.standard_normal((5, 256)).astype(np.float32)
    before = session(model).run(None, {"a": a})

    assert rewrite_block_int8(model) == 1
    assert [(n.op_type, n.domain) for n in model.graph.node] == [
        (OP_TYPE, "llmc"),
        ("MatMulNBits", "com.microsoft"),
    ]
    assert "llmc" in {o.domain for o in model.opset_import}
    after = session(model).run(None, {"a": a})
    np.testing.assert_allclose(after[0], before[0], rtol=1e-4, atol=1e-5 * np.abs(before[0]).max())
    np.testing.assert_array_equal(after[1], before[1])
    assert rewrite_block_int8(model) == 0  # nothing left to replace


class _Weights(ctypes.Structure):
    """``struct i8mm_weights`` (int8_matmul.h)."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in ("k", "n", "block_size", "num_blocks", "num_panels")),
        *((name, ctypes.c_void_p) for name in ("codes", "scales")),
        ("prefetch", ctypes.c_int),
    ]


def kernel_library(tmp_path: Path, march: str) -> ctypes.CDLL:
    """The int8 kernel alone (packing, VNNI, AVX2 and AMX parts), built with gcc for
    ``-march=march``, loaded with ctypes."""
    kernel = Path(ort_op.__file__).parent.parent / "int8_matmul"
    sources = [str(kernel / f) for f in ("int8_matmul.c", "vnni.c", "avx2.c", "amx.c")]
    lib_path = tmp_path / f"i8mm_{march}.so"
    subprocess.run(
        ["gcc", "-O2", f"-march={march}", "-shared", "-fPIC", *sources, "-o", str(lib_path)],
        check=True,
    )
    return ctypes.CDLL(str(lib_path))


def packed_problem(lib: ctypes.CDLL, seed: int, m: int, k: int, n: int, block: int):
    """A random weight packed by ``lib.i8mm_pack`` and activations: (weights struct, codes,
    scales, a [m, k] float32)."""
    rng = np.random.default_rng(seed)
    codes, scales = weights(rng, k, n, block)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = _Weights()
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    packed = lib.i8mm_pack(
        ctypes.byref(w), ptr(codes.ctypes.data), ptr(scales.ctypes.data), i64(k), i64(n), i64(block)
    )
    assert packed == 0
    return w, codes, scales, a


def quantized_rows(lib: ctypes.CDLL, w: _Weights, a: np.ndarray, block: int, gated: bool = False):
    """``lib.i8mm_quantize_rows`` of every row of ``a``: (codes int8 [m, k], scales float32
    [m, k / block], za int32 [m, k / block]), checked against the header's definition of za:
    128 times the sum of a block's codes."""
    m, k = a.shape[0], w.k
    qa, sa = np.empty((m, k), np.int8), np.empty((m, k // block), np.float32)
    za = np.empty((m, k // block), np.int32)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.i8mm_quantize_rows(ctypes.byref(w), ptr(a.ctypes.data), ctypes.c_int(int(gated)), i64(0),
                           i64(m), ptr(qa.ctypes.data), ptr(sa.ctypes.data),
                           ptr(za.ctypes.data))  # fmt: skip
    block_sums = qa.reshape(m, k // block, block).astype(np.int32).sum(axis=2)
    np.testing.assert_array_equal(za, 128 * block_sums)
    return qa, sa, za


def run_items(lib: ctypes.CDLL, w: _Weights, qa, sa, za, n: int) -> np.ndarray:
    """y [m, n] float32 from every ``lib.i8mm_item`` of the quantized rows."""
    m = qa.shape[0]
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    y = np.full((m, n), np.nan, np.float32)
    lib.i8mm_num_items.restype = ctypes.c_int64
    for item in range(lib.i8mm_num_items(ctypes.byref(w), i64(m))):
        lib.i8mm_item(ctypes.byref(w), ptr(qa.ctypes.data), ptr(sa.ctypes.data),
                      ptr(za.ctypes.data), i64(m), i64(item), ptr(y.ctypes.data))  # fmt: skip
    return y


@pytest.mark.parametrize("march", ["native", "x86-64"])
def test_kernel_built_with_and_without_vnni_computes_the_same(tmp_path, march: str) -> None:
    """The C kernel alone (ctypes), built for this host and for baseline x86-64 (its portable
    path, what hosts without AVX-512 VNNI run)."""
    if march == "x86-64" and platform.machine() != "x86_64":
        pytest.skip("baseline x86-64 build")
    lib = kernel_library(tmp_path, march)
    m, k, n, block = 11, 384, 136, 128
    w, codes, scales, a = packed_problem(lib, 5, m, k, n, block)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    y = run_items(lib, w, *quantized_rows(lib, w, a, block), n)
    lib.i8mm_free(ctypes.byref(w))
    ref = expected(a, codes, scales)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    gate = np.concatenate([np.linspace(-30, 30, 301), [0.0, -0.0, 1e-30]]).astype(np.float32)
    up = np.random.default_rng(5).standard_normal(gate.size).astype(np.float32)
    out = np.empty_like(gate)
    lib.i8mm_gelu_tanh_gate(
        ptr(gate.ctypes.data), ptr(up.ctypes.data), i64(gate.size), ptr(out.ctypes.data)
    )
    # atol: deep in the negative tail float64 tanh rounds to -1 (GELU 0), ours keeps x * e^z
    np.testing.assert_allclose(out, gelu_tanh(gate) * up, rtol=2e-6, atol=1e-9)


def _product(
    lib: ctypes.CDLL, m: int, k: int, n: int, block: int, gated: bool, prefetch: int | None = None
):
    """Quantized rows (codes, scales, za) and the product of a seeded problem by ``lib``'s items;
    ``gated``: the input is [gate | up] (I8MM_INPUT_GELU_TANH_GATE); ``prefetch``: the tiles'
    prefetch of the next panel forced on (1) or off (0), None: the host's choice."""
    rng = np.random.default_rng(m * 1000 + n)
    codes, scales = weights(rng, k, n, block)
    a = rng.standard_normal((m, 2 * k if gated else k)).astype(np.float32)
    w = _Weights()
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    assert lib.i8mm_pack(ctypes.byref(w), ptr(codes.ctypes.data), ptr(scales.ctypes.data),
                         i64(k), i64(n), i64(block)) == 0  # fmt: skip
    if prefetch is not None:
        w.prefetch = prefetch
    qa, sa, za = quantized_rows(lib, w, a, block, gated)
    y = run_items(lib, w, qa, sa, za, n)
    lib.i8mm_free(ctypes.byref(w))
    return qa, sa, za, y


def test_portable_avx2_and_host_tiles_give_the_same_floats(tmp_path) -> None:
    """The kernel built for baseline x86-64 (portable C), for Haswell (the AVX2 tiles: |w| x
    a sign(w) in vpmaddubsw, pairs summed by vpmaddwd) and for this host (VNNI or AMX tiles
    where it has them) quantizes the same codes and writes the same floats, bit for bit: one
    row (the AVX2 path's whole-panel form), rows in groups of 3 with a remainder, columns
    that end inside a panel, a vector and a lane. The GELU-gated input, whose SIMD GELU the
    portable build computes in scalar code, is compared between the SIMD builds."""
    if platform.machine() != "x86_64" or "avx2" not in detect_host_isa().features:
        pytest.skip("needs an x86-64 host that runs AVX2")
    libs = {march: kernel_library(tmp_path, march) for march in ("x86-64", "haswell", "native")}
    for m, k, n, block in ((1, 640, 200, 32), (7, 256, 136, 128), (16, 96, 5, 32), (6, 64, 70, 32)):
        qa, sa, za, y = _product(libs["x86-64"], m, k, n, block, gated=False)
        # the host's tiles with and without their prefetch of the next panel (a CPU's choice)
        runs = [("haswell", None), ("native", 0), ("native", 1)]
        for march, prefetch in runs:
            qa2, sa2, za2, y2 = _product(libs[march], m, k, n, block, False, prefetch)
            np.testing.assert_array_equal(qa2, qa)
            np.testing.assert_array_equal(sa2, sa)
            np.testing.assert_array_equal(za2, za)
            np.testing.assert_array_equal(y2, y, err_msg=f"{march} {prefetch}, m={m} n={n}")
        assert not np.isnan(y).any()
    for m, n in ((1, 64), (8, 130)):
        haswell = _product(libs["haswell"], m, 128, n, 32, gated=True)
        native = _product(libs["native"], m, 128, n, 32, gated=True)
        for ours, theirs in zip(haswell, native, strict=True):
            np.testing.assert_array_equal(ours, theirs)


def test_rewrite_folds_a_gelu_gated_down_projection_into_one_node() -> None:
    """Split -> Gelu(tanh) -> Mul -> MatMulNBits, as ONNX Runtime leaves Gemma's MLP, becomes one
    BlockInt8MatMul reading the gate/up output; a Gelu of the other form stays as it is."""
    rng = np.random.default_rng(7)
    k = 128
    codes, scales = weights(rng, k, 32, 64)

    def mlp(approximate: str) -> onnx.ModelProto:
        model = one_node_model(codes, scales, "MatMulNBits")
        model.graph.input[0].name = "gate_up"
        nodes = [
            helper.make_node("Split", ["gate_up", "sizes"], ["gate", "up"], axis=-1),
            helper.make_node("Gelu", ["gate"], ["gelu"], approximate=approximate),
            helper.make_node("Mul", ["gelu", "up"], ["a"]),
        ]
        matmul = model.graph.node.pop()
        model.graph.node.extend([*nodes, matmul])
        model.graph.initializer.append(numpy_helper.from_array(np.array([k, k]), "sizes"))
        return model

    x = (rng.standard_normal((9, 2 * k)) * 2).astype(np.float32)
    model = mlp("tanh")
    before = session(model).run(None, {"gate_up": x})[0]
    assert rewrite_block_int8(model) == 1
    (node,) = model.graph.node
    assert node.op_type == OP_TYPE and list(node.input)[0] == "gate_up"
    assert helper.get_attribute_value(node.attribute[-1]) == b"gelu_tanh"
    after = session(model).run(None, {"gate_up": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-3, atol=1e-3 * np.abs(before).max())

    exact_gelu = mlp("none")
    assert rewrite_block_int8(exact_gelu) == 1
    assert [n.op_type for n in exact_gelu.graph.node] == ["Split", "Gelu", "Mul", OP_TYPE]


def test_rewrite_folds_the_gate_into_a_quantized_gate_up_projection() -> None:
    """When the gate/up projection is 8-bit too, the GELU gate folds into its output
    (``output_gate``): two BlockInt8MatMul nodes, the first writing gelu_tanh(gate) * up."""
    rng = np.random.default_rng(8)
    hidden, k = 64, 128
    up_codes, up_scales = weights(rng, hidden, 2 * k, 64)
    down_codes, down_scales = weights(rng, k, 32, 64)
    model = one_node_model(up_codes, up_scales, "MatMulNBits")
    down = one_node_model(down_codes, down_scales, "MatMulNBits").graph.node[0]
    down.input[:] = ["a2", "b2", "scales2"]
    model.graph.node[0].output[0] = "gate_up"
    model.graph.node.extend(
        [
            helper.make_node("Split", ["gate_up", "sizes"], ["gate", "up"], axis=-1),
            helper.make_node("Gelu", ["gate"], ["gelu"], approximate="tanh"),
            helper.make_node("Mul", ["gelu", "up"], ["a2"]),
            down,
        ]
    )
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([k, k]), "sizes"),
            numpy_helper.from_array(down_codes, "b2"),
            numpy_helper.from_array(down_scales, "scales2"),
        ]
    )
    x = (rng.standard_normal((40, hidden)) * 2).astype(np.float32)
    before = session(model).run(None, {"a": x})[0]
    assert rewrite_block_int8(model) == 2
    ops = [(n.op_type, {a.name for a in n.attribute} & {"input_gate", "output_gate"})
           for n in model.graph.node]  # fmt: skip
    assert ops == [(OP_TYPE, {"output_gate"}), (OP_TYPE, set())]
    assert list(model.graph.node[1].input)[0] == model.graph.node[0].output[0]
    after = session(model).run(None, {"a": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-3, atol=2e-3 * np.abs(before).max())


@pytest.mark.parametrize(
    ("m", "padded"),
    [(45, 48), (16, 16), (15, 0), (32, 32), (33, 48)],
    ids=["32+16", "16", "too-few", "32", "32+16-of-1"],
)
def test_amx_path_equals_the_vnni_tiles_bit_for_bit(tmp_path, m: int, padded: int) -> None:
    """On a host whose OS grants AMX tile data, the AMX items (signed codes, tdpbssd) give the
    same floats as the VNNI tiles (unsigned weight codes, vpdpbusd): the same integer block sums,
    scaled in the same order; rows past m stay unwritten. Products of 16 rows and more take
    the path, their rows padded to a multiple of 16 (items of 32 rows, the last of 16)."""
    lib = kernel_library(tmp_path, "native")
    for name in ("i8mm_amx_rows", "i8mm_amx_num_items", "i8mm_num_items"):
        getattr(lib, name).restype = ctypes.c_int64
    k, n, block = 256, 200, 128
    w, codes, scales, a = packed_problem(lib, 9, m, k, n, block)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    if lib.i8mm_amx_rows(ctypes.byref(w), i64(64)) == 0:
        lib.i8mm_free(ctypes.byref(w))
        pytest.skip("no AMX here (not built for it, or the OS does not grant tile data)")
    rows = lib.i8mm_amx_rows(ctypes.byref(w), i64(m))
    assert rows == padded
    if rows == 0:  # fewer than 16 rows stay on the VNNI tiles
        lib.i8mm_free(ctypes.byref(w))
        return
    assert lib.i8mm_amx_num_items(ctypes.byref(w), i64(rows)) == -(-rows // 32) * -(-n // 64)
    qa, sa, za = quantized_rows(lib, w, a, block)
    vnni = run_items(lib, w, qa, sa, za, n)
    qs, ss = np.zeros((rows, k), np.int8), np.zeros((rows, k // block), np.float32)
    qs[:m], ss[:m] = qa, sa  # the AMX items read rows padded with zero codes and scales
    amx = np.full((m + 1, n), np.nan, np.float32)  # one row more: must stay untouched
    for item in range(lib.i8mm_amx_num_items(ctypes.byref(w), i64(rows))):
        lib.i8mm_amx_item(ctypes.byref(w), ptr(qs.ctypes.data), ptr(ss.ctypes.data), i64(m),
                          i64(rows), i64(item), ptr(amx.ctypes.data))  # fmt: skip
    lib.i8mm_free(ctypes.byref(w))
    np.testing.assert_array_equal(amx[:m], vnni)
    assert np.isnan(amx[m]).all()
