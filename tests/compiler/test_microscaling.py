"""``--quant nvfp4`` and ``--quant mxfp8``: numerics against references written from the specs
(the E2M1 and E4M3 grids enumerated here), the CPU emulation bit for bit on ONNX Runtime, GPTQ,
the TensorRT lint of their graphs, and tiny-model builds for cpu (emulated) and sm100 (stage)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.calibration.observers import TensorStats
from llmc.compiler.backends.tensorrt.finish import TensorRTUnavailableError
from llmc.compiler.backends.tensorrt.lint import lint_file, lint_model
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize.formats import FORMATS, fp8, int8_weight_only, mxfp8, nvfp4
from llmc.compiler.quantize.formats import microscaling_emulation as microscaling_cpu
from llmc.compiler.quantize.qdq import UniqueNames, write_linear
from llmc.engine.manifest import read_manifest
from llmc.engine.stage import read_stage
from llmc.errors import BuildConfigError
from llmc.quant import microscaling as ms
from llmc.quant.grids import dequantize
from llmc.quant.protocol import QuantizedLinear, QuantSpec
from llmc.runtime.runners.ort_env import session_options
from tests.tiny_models import calibration_text, make_tiny_gemma3, quant_config

# --- references from the specs: grids enumerated, ties to the even code (even index) ---------

#: FP4 E2M1 magnitudes, by code (the index's parity is the mantissa bit).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
#: FP8 E4M3FN magnitudes, by code: subnormals m/8 * 2^-6, normals (1 + m/8) * 2^(e-7), no
#: e=15 m=7 (NaN); 448 the largest.
E4M3 = np.array(
    [m / 8 * 2.0**-6 for m in range(8)]
    + [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if (e, m) != (15, 7)]
)


def round_to(grid: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest value of ``grid`` (magnitudes), ties to the even code,
    saturating at its largest; the sign kept (zeros too), as float32."""
    a = np.minimum(np.abs(np.asarray(x, np.float64)), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.copysign(grid[pick], x).astype(np.float32)


def nvfp4_ref(v: np.ndarray, g: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, E4M3 block scale, dequantized) of one block ``v`` float32 by NVIDIA's NVFP4
    recipe: s = E4M3(amax / 6 / g), q = E2M1(v / (s * g)), v ~ q * (s * g)."""
    amax = np.abs(v).max()
    s8 = round_to(E4M3, np.float32(amax / np.float32(6)) / g)
    full = np.float32(s8 * g)
    with np.errstate(over="ignore"):
        q = round_to(E2M1, v / max(full, np.float32(2.0**-126)))
    return q, s8, (q * full).astype(np.float32)


def mxfp8_ref(v: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """(codes, E8M0 exponent, dequantized) of one block ``v`` by OCP MX v1.0:
    scale = 2^(floor(log2(amax)) - 8), q = E4M3(v / scale)."""
    amax = max(float(np.abs(v).max()), 2.0**-119)
    e = math.frexp(amax)[1] - 1 - 8  # frexp: amax = m * 2^k with m in [0.5, 1)
    scale = np.float32(2.0**e)
    q = round_to(E4M3, v / scale)
    return q, e, (q * scale).astype(np.float32)


def _blocks_ref(x: np.ndarray, block: int, ref, *args) -> np.ndarray:
    """``ref``'s dequantized blocks of ``x`` [R, K] along K."""
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], block):
            out[r, b : b + block] = ref(x[r, b : b + block], *args)[-1]
    return out


def activations(block: int) -> np.ndarray:
    """[R, 64] float32 rows: random at scales 1e-6..1e6, zeros, subnormals, exact E2M1 and
    E4M3 ties, saturating blocks and amaxes at (and just below) powers of two."""
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(64) * 10.0 ** rng.uniform(-6, 6) for _ in range(24)]
    rows += [np.zeros(64), np.full(64, 1e-40), rng.standard_normal(64) * 1e-38]
    e2m1_ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]  # with g = 1: block scale 1
    rows.append(np.tile(e2m1_ties + [-t for t in e2m1_ties], 4))
    e4m3_ties = np.array([1.0625, 1.1875, 1.3125, 0.5 + 1 / 32, 256.0]) / 256  # amax 1: 2^-8
    rows.append(np.resize(np.concatenate([e4m3_ties, -e4m3_ties]), 64))
    rows.append(np.resize([1.9, -1.95, 12.0 * 2688, 0.3], 64))  # saturate: E4M3 max, E2M1 max
    for k in (-119, -100, -3, 0, 1, 7, 64, 127):
        p = np.float32(2.0**k)
        rows += [np.full(64, p), np.full(64, np.nextafter(p, np.float32(0)))]
    x = np.stack(rows).astype(np.float32)
    x[5, :block] = 0.0  # a zero block beside non-zero ones
    return x


# --- numerics --------------------------------------------------------------------------------


def test_grids_round_to_nearest_even_and_saturate():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 9.0, -0.25, -3.5, -7.0, 1e30])
    x = np.concatenate([ties, E2M1, -E2M1, np.linspace(-8, 8, 1001)]).astype(np.float32)
    want = round_to(E2M1, x)
    assert np.array_equal(ms.FP4_E2M1.round(x), want)
    assert [float(v) for v in want[:9]] == [0, 1, 1, 2, 2, 4, 4, 6, 6]  # even codes win ties
    import torch

    assert np.array_equal(ms.FP4_E2M1.round_torch(torch.from_numpy(x)).numpy(), want)
    # E4M3 (ml_dtypes, what the quantizers and ORT's Cast use) against the enumerated grid
    y = np.concatenate([E4M3, (E4M3[1:] + E4M3[:-1]) / 2, [460.0, 1e6]]).astype(np.float32)
    cast = np.clip(y, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(cast, round_to(E4M3, y))


def _weight(k: int = 64, n: int = 24, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:32, 3] = 0.0  # zero blocks
    w[16:32, 5] *= 1e-6  # a block whose E4M3 scale underflows to 0
    w[40, 7] = 2.0  # an outlier: the per-tensor scale
    return w


def test_nvfp4_weights_match_the_recipe():
    w = _weight()
    qw = ms.quantize_nvfp4(w)
    g = np.float32(np.abs(w).max()) / np.float32(6 * 448)
    assert qw.global_scale == g and qw.block_size == 16 and qw.axis == 0
    assert qw.data.dtype == ml_dtypes.float4_e2m1fn and qw.block_scale.shape == (4, 24)
    deq = dequantize(qw)
    for b in range(4):
        for n in range(24):
            rows = slice(16 * b, 16 * (b + 1))
            q, s8, want = nvfp4_ref(w[rows, n], g)
            assert np.array_equal(qw.data[rows, n].astype(np.float32), q)
            assert qw.block_scale[b, n].astype(np.float32) == s8
            assert np.array_equal(deq[rows, n].view(np.uint32), want.view(np.uint32))
    assert qw.block_scale.astype(np.float32).max() == 448  # the outlier's block: E4M3's max
    assert np.all(deq[16:32, 5] == 0)  # its scale rounded to 0


def test_mxfp8_weights_match_the_ocp_spec():
    w = _weight()
    w[32:64, 9] = np.float32(2.0**-3)  # amax a power of two: floor(log2) exact
    qw = ms.quantize_mxfp8(w)
    assert qw.global_scale is None and qw.block_size == 32 and qw.block_scale.dtype == np.uint8
    deq = dequantize(qw)
    for b in range(2):
        for n in range(24):
            rows = slice(32 * b, 32 * (b + 1))
            q, e, want = mxfp8_ref(w[rows, n])
            assert qw.block_scale[b, n] == e + 127  # E8M0: biased exponent
            assert np.array_equal(qw.data[rows, n].astype(np.float32), q)
            assert np.array_equal(deq[rows, n].view(np.uint32), want.view(np.uint32))
    assert qw.block_scale[1, 9] == -3 - 8 + 127
    assert qw.block_scale[0, 3] == 0  # a zero block: the smallest scale, 2^-127


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp8"])
def test_activation_fake_quant_matches_the_reference(kind):
    x = activations(16 if kind == "nvfp4" else 32)
    if kind == "nvfp4":
        g = ms.nvfp4_global_scale(6 * 448)  # 1.0: the tie rows sit on block scale 1
        assert g == 1.0
        got, want = ms.fake_quant_nvfp4(x, g), _blocks_ref(x, 16, nvfp4_ref, g)
    else:
        got, want = ms.fake_quant_mxfp8(x), _blocks_ref(x, 32, mxfp8_ref)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(got, x)  # it does quantize


def test_k_not_a_multiple_of_the_block_is_refused_with_what_to_do():
    with pytest.raises(ms.BlockSizeError, match="K = 40.*--exclude"):
        ms.quantize_nvfp4(np.ones((40, 8), np.float32))
    with pytest.raises(ValueError, match="blocks of 32"):
        ms.quantize_mxfp8(np.ones((48, 8), np.float32))


def _stats(x: np.ndarray) -> TensorStats:
    s = TensorStats.empty(x.shape[1], 256, gram=True)
    s.update(x, np.random.default_rng(0), 256)
    return s


@pytest.mark.parametrize("fmt", [nvfp4.FORMAT, mxfp8.FORMAT], ids=["nvfp4", "mxfp8"])
def test_gptq_keeps_the_block_scales_and_lowers_the_output_error(fmt):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    x = x + 0.3 * x @ rng.standard_normal((64, 64)).astype(np.float32)  # correlated channels:
    x[:, :4] *= 20  # what GPTQ's updates exploit; and salient ones
    w = (rng.standard_normal((64, 48)) * 0.05).astype(np.float32)
    stats = _stats(x)
    nearest = fmt.quantize(w, stats, QuantSpec(quant=fmt.name, weight_rounding="nearest"))
    gptq = fmt.quantize(w, stats, QuantSpec(quant=fmt.name, weight_rounding="gptq"))
    assert (nearest.record["rounding"], gptq.record["rounding"]) == ("nearest", "gptq")
    assert np.array_equal(gptq.weight.scale, nearest.weight.scale)
    assert np.array_equal(gptq.weight.block_scale, nearest.weight.block_scale)
    assert gptq.weight.data.dtype == nearest.weight.data.dtype
    assert not np.array_equal(gptq.weight.data, nearest.weight.data)

    def error(ql: QuantizedLinear) -> float:
        return float(((x @ (w - dequantize(ql.weight))) ** 2).mean())

    assert error(gptq) < 0.5 * error(nearest)


# --- the CPU emulation on ONNX Runtime -------------------------------------------------------


def _trt_activation_graph(kind: str, dims: list, global_scale: float) -> onnx.ModelProto:
    """x ``dims`` -> the TensorRT form of ``kind``'s dynamic quantization and dequantization
    (along the last axis) -> y."""
    fp8 = TensorProto.FLOAT8E4M3FN
    if kind == "nvfp4":
        nodes = [
            helper.make_node(
                "TRT_FP4DynamicQuantize", ["x", "g"], ["xq", "xs"], "q", domain="trt",
                axis=-1, block_size=16, scale_type=fp8,
            ),
            helper.make_node("DequantizeLinear", ["xs", "g"], ["s"], "s_dq"),
            helper.make_node("DequantizeLinear", ["xq", "s"], ["y"], "dq", axis=-1, block_size=16),
        ]  # fmt: skip
        inits = [numpy_helper.from_array(np.array(global_scale, np.float32), "g")]
    else:
        nodes = [
            helper.make_node(
                "TRT_MXFP8DynamicQuantize", ["x"], ["xq", "xe"], "q", domain="trt",
                axis=-1, block_size=32, output_dtype=fp8,
            ),
            helper.make_node(
                "TRT_MXFP8DequantizeLinear", ["xq", "xe"], ["y"], "dq", domain="trt",
                axis=-1, block_size=32, output_dtype=TensorProto.FLOAT,
            ),
        ]  # fmt: skip
        inits = []
    graph = helper.make_graph(
        nodes,
        kind,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        inits,
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("trt", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _session(model: onnx.ModelProto, tmp_path) -> tuple[ort.InferenceSession, dict[str, int]]:
    """An ORT_ENABLE_ALL CPU session of ``model`` and the op counts of its optimized graph."""
    opts = session_options(2)  # the process's global pool, as every llmc session
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    ops: dict[str, int] = {}
    for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return session, ops


@pytest.mark.parametrize("dims", [["R", 64], [4, "T", 64]], ids=["2d", "3d"])
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp8"])
def test_cpu_emulation_of_the_activations_is_bit_exact(kind, dims, tmp_path):
    model = _trt_activation_graph(kind, dims, 1.0)
    rewrite = microscaling_cpu.emulate_nvfp4 if kind == "nvfp4" else microscaling_cpu.emulate_mxfp8
    assert rewrite(model) == 1
    assert {n.domain for n in model.graph.node} == {""}
    assert [o.domain for o in model.opset_import] == [""]
    session, _ = _session(model, tmp_path)
    x = activations(16 if kind == "nvfp4" else 32)
    if kind == "nvfp4":  # ml_dtypes' casts (the library) and the enumerated grids
        libs, spec = ms.fake_quant_nvfp4(x, 1.0), _blocks_ref(x, 16, nvfp4_ref, np.float32(1))
    else:
        libs, spec = ms.fake_quant_mxfp8(x), _blocks_ref(x, 32, mxfp8_ref)
    shape = (4, -1, 64) if len(dims) == 3 else x.shape
    y = session.run(None, {"x": x[:44].reshape(shape) if len(dims) == 3 else x})[0]
    y = y.reshape(-1, 64)
    assert np.array_equal(y.view(np.uint32), libs[: len(y)].view(np.uint32))
    assert np.array_equal(y.view(np.uint32), spec[: len(y)].view(np.uint32))


class _Target:
    """What ``write_linear`` reads of a ``QuantTarget``."""

    def __init__(self, node: ir.Node, module: str):
        self.node, self.module = node, module


def _three_projections(fmt) -> tuple[onnx.ModelProto, list, np.ndarray]:
    """x [T, 64] -> three MatMuls reading it (as q/k/v), each quantized by ``fmt`` through
    ``qdq.write_linear``; returns the graph, the QuantizedLinears and the float weights."""
    rng = np.random.default_rng(4)
    x = ir.Value(name="x", shape=ir.Shape(["T", 64]), type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 23}, name="projections")
    names = UniqueNames(graph)
    calib = rng.standard_normal((256, 64)).astype(np.float32)
    quantized = []
    for i in range(3):
        w = (rng.standard_normal((64, 40)) * 0.1).astype(np.float32)
        value = ir.Value(name=f"w{i}", const_value=ir.tensor(w, name=f"w{i}"))
        graph.register_initializer(value)
        matmul = ir.node("MatMul", [x, value], name=f"proj{i}")
        matmul.outputs[0].name = f"y{i}"
        graph.append(matmul)
        graph.outputs.append(matmul.outputs[0])
        ql = fmt.quantize(w, _stats(calib), QuantSpec(quant=fmt.name))
        write_linear(graph, _Target(matmul, f"proj{i}"), ql, names)
        quantized.append(ql)
        del graph.initializers[f"w{i}"]
    return ir.to_proto(ir.Model(graph, ir_version=10)), quantized, calib


@pytest.mark.parametrize("fmt", [nvfp4.FORMAT, mxfp8.FORMAT], ids=["nvfp4", "mxfp8"])
def test_emulated_projections_compute_the_fake_quant_forward(fmt, tmp_path):
    model, quantized, calib = _three_projections(fmt)
    ops = {n.op_type for n in model.graph.node if n.domain == "trt"}
    assert ops and fmt.rewrite_for_cpu(model) == 6  # 3 weights, 3 activations
    session, optimized = _session(model, tmp_path)
    # ORT merges the three emulations of the shared input but their QuantizeLinear nodes: the
    # fast-path check finds one per module
    assert optimized[fmt.cpu_kernel] == 3
    x = np.random.default_rng(5).standard_normal((9, 64)).astype(np.float32) * 3
    for y, ql in zip(session.run(None, {"x": x}), quantized, strict=True):
        if fmt is nvfp4.FORMAT:
            xq = ms.fake_quant_nvfp4(x, ms.nvfp4_global_scale(ql.activation.amax))
        else:
            xq = ms.fake_quant_mxfp8(x)
        want = xq.astype(np.float64) @ dequantize(ql.weight).astype(np.float64)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()
        assert np.abs(y - x @ dequantize(ql.weight)).max() > 1e-3  # the activations are quantized


def test_fp8_emulation_leaves_nvfp4_block_scales_to_nvfp4():
    model, _, _ = _three_projections(nvfp4.FORMAT)
    assert fp8.emulate_fp8_weights(model) == 0  # its FP8 tensors are block scales, not weights
    assert nvfp4.FORMAT.rewrite_for_cpu(model) == 6


# --- build configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["nvfp4", "mxfp8"])
def test_defaults_and_target_rules(quant):
    config = BuildConfig.of(quant=quant)
    spec = config.quant_spec()
    assert spec.weight_only8 == ("lm_head",) and spec.exclude == ()
    assert config.calib_method == "max" and spec.weight_rounding == "gptq"
    assert spec.kv_cache_dtype == "fp8" and config.kv_cache_storage == "fp8"  # auto: fp8
    assert BuildConfig.of(quant=quant, kv_cache_dtype="int8").kv_cache_storage == "int8"
    assert BuildConfig.of(quant="fp8").kv_cache_storage == "float32"  # others: unchanged
    for arch in ("cpu", "sm100", "sm120"):
        BuildConfig.of(quant=quant, arch=arch).validate()
    with pytest.raises(BuildConfigError, match=f"--quant {quant} needs Blackwell.*sm100"):
        BuildConfig.of(quant=quant, arch="sm90").validate()
    assert FORMATS[quant].weight_bytes == {"nvfp4": 0.5 + 1 / 16, "mxfp8": 1 + 1 / 32}[quant]


@pytest.mark.parametrize(
    "fmt", [fp8.FORMAT, nvfp4.FORMAT, mxfp8.FORMAT], ids=["fp8", "nvfp4", "mxfp8"]
)
def test_cpu_weights_made_at_quantization_are_the_cpu_lowerings_weights(fmt):
    """A cpu build writes each emulated weight as it is quantized (``cpu_weight``, so the
    build streams); they are the float32 weights the CPU lowering of the Q/DQ graph makes."""
    model, quantized, _ = _three_projections(fmt)
    assert fmt.rewrite_for_cpu(model) >= 3
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for i, ql in enumerate(quantized):
        matmul = next(n for n in model.graph.node if n.name == f"proj{i}")
        np.testing.assert_array_equal(inits[matmul.input[1]], fmt.cpu_weight(ql.weight))
    assert int8_weight_only.FORMAT.cpu_weight(quantized[0].weight) is None  # runs as is


# --- tiny-model builds: cpu (emulated) and sm100 (portable stage, TensorRT lint) ------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("microscaling")
    return root, make_tiny_gemma3(root / "ckpt", seed=1, sharp=True), calibration_text(root)


def _config(root, ckpt, data, quant: str, name: str, **kw) -> BuildConfig:
    return quant_config(ckpt, root, data, quant, name, **kw)


def _engine_weights(engine_dir) -> list[np.ndarray]:
    """Every float32 initializer of the engine's segments."""
    out = []
    for path in sorted((engine_dir / "segments").glob("*.onnx")):
        model = onnx.load(str(path))
        out += [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == 1]
    return out


@pytest.mark.parametrize("quant", ["nvfp4", "mxfp8"])
def test_cpu_build_runs_the_quantized_weights_and_reports_accuracy(setup, quant, monkeypatch):
    root, ckpt, data = setup
    fmt = FORMATS[quant]
    made = {}  # {weight's bytes: (float weight, its quantization)} of the format's modules
    original = type(fmt).quantize

    def recording(self, weight, stats, spec):  # a module may be quantized twice (anchor)
        ql = original(self, weight, stats, spec)
        made[np.asarray(weight, np.float32).tobytes()] = (np.array(weight), ql)
        return ql

    monkeypatch.setattr(type(fmt), "quantize", recording)
    result = build(_config(root, ckpt, data, quant, quant, weight_rounding="nearest"))
    m = read_manifest(result.engine_dir)
    q = m.quantization
    assert m.quant == quant and m.kv_cache_dtype == "fp8"
    assert q["counts"] == {fmt.label: 8, "int8_weight_only": 1} and len(made) == 8
    assert q["fast_path"]["QuantizeLinear"] == {"expected": 8, "found": 8}
    acc = m.accuracy_report
    assert 0.0 < acc["top1_agreement"] <= 1.0 and acc["mean_kl"] > 0.0  # quantized, not float
    engine = _engine_weights(result.engine_dir)
    for weight, ql in made.values():
        k, n = weight.shape
        block = 16 if quant == "nvfp4" else 32
        ref = nvfp4_ref if quant == "nvfp4" else mxfp8_ref
        g = np.float32(np.abs(weight).max()) / np.float32(6 * 448)
        want = np.empty_like(weight)
        for b in range(0, k, block):
            for j in range(n):
                args = (g,) if quant == "nvfp4" else ()
                want[b : b + block, j] = ref(weight[b : b + block, j], *args)[-1]
        assert np.array_equal(dequantize(ql.weight), want)
        # the engine multiplies by exactly these float32 weights
        assert any(e.shape == want.shape and np.array_equal(e, want) for e in engine)


@pytest.fixture(scope="module")
def stages(setup) -> dict:
    """{quant: sm100 portable stage dir} for nvfp4 and mxfp8 (the build stops at the stage: no
    TensorRT here)."""
    root, ckpt, data = setup
    out = {}
    for quant in ("nvfp4", "mxfp8"):
        with pytest.raises(TensorRTUnavailableError):
            build(_config(root, ckpt, data, quant, f"{quant}-sm100", arch="sm100"))
        out[quant] = root / f"{quant}-sm100"
    return out


@pytest.mark.parametrize("quant", ["nvfp4", "mxfp8"])
def test_sm100_stage_passes_the_tensorrt_lint_and_sm90_fails_it(stages, quant):
    stage = read_stage(stages[quant])
    assert stage.quant == quant and stage.lint["errors"] == 0
    path = next(stages[quant].glob("*.onnx"))
    model = onnx.load(str(path), load_external_data=False)
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    if quant == "nvfp4":
        assert ("trt", "TRT_FP4DynamicQuantize") in ops and ("", "DequantizeLinear") in ops
        types = {t.data_type for t in model.graph.initializer}
        assert {TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E4M3FN} <= types
    else:
        assert {("trt", "TRT_MXFP8DynamicQuantize"), ("trt", "TRT_MXFP8DequantizeLinear")} <= ops
    assert lint_file(path, "sm120").passed
    sm90 = lint_file(path, "sm90")
    assert not sm90.passed
    assert all("sm100 or newer" in f.message for f in sm90.errors)
    assert {f.check for f in sm90.errors} == (
        {"qdq", "microscaling"} if quant == "nvfp4" else {"microscaling"}
    )


def _lint_errors(model: onnx.ModelProto, stage_dir) -> list[str]:
    return [f.message for f in lint_model(model, "sm100", stage_dir).errors]


def test_lint_rejects_each_defect_of_the_nvfp4_graph(stages):
    stage_dir = stages["nvfp4"]
    path = next(stage_dir.glob("*.onnx"))
    model = onnx.load(str(path), load_external_data=False)
    assert _lint_errors(model, stage_dir) == []

    def quantizer(m: onnx.ModelProto) -> onnx.NodeProto:
        return next(n for n in m.graph.node if n.op_type == "TRT_FP4DynamicQuantize")

    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    next(a for a in quantizer(bad).attribute if a.name == "block_size").i = 32
    assert "block_size must be 16" in _lint_errors(bad, stage_dir)

    bad.CopyFrom(model)
    quantizer(bad).op_type = "TRT_FP4Quantize"
    assert any("no importer" in e for e in _lint_errors(bad, stage_dir))

    bad.CopyFrom(model)  # the per-tensor scale of a weight's two-level DQ from a graph input
    scale_dq = next(
        n for n in bad.graph.node if n.name.endswith("/scale_DQ") and "input" not in n.name
    )
    scale_dq.input[1] = "key_cache.0"
    assert any("must be a constant initializer" in e for e in _lint_errors(bad, stage_dir))

    bad.CopyFrom(model)  # an FP4 weight DQ with blocks of 32
    weight_dq = next(n for n in bad.graph.node if n.name.endswith("/weight_DQ"))
    next(a for a in weight_dq.attribute if a.name == "block_size").i = 32
    assert "FP4 data must be block-wise in blocks of 16" in _lint_errors(bad, stage_dir)


def test_lint_rejects_an_mxfp8_scale_that_is_not_e8m0(stages):
    stage_dir = stages["mxfp8"]
    model = onnx.load(str(next(stage_dir.glob("*.onnx"))), load_external_data=False)
    dq = next(n for n in model.graph.node if n.name.endswith("/weight_DQ"))
    scale = next(t for t in model.graph.initializer if t.name == dq.input[1])
    array = numpy_helper.to_array(scale, base_dir=str(stage_dir)).astype(np.float32)
    scale.CopyFrom(numpy_helper.from_array(array, scale.name))  # float32, not uint8 E8M0
    assert any("E8M0" in e for e in _lint_errors(model, stage_dir))
