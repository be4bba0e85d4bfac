"""The quantized KV cache (``--kv-cache-dtype fp8|int8``) of ``llmc::PagedAttention``: the
kernel's write and read against ml_dtypes and numpy, the kernel against the torch reference on
quantized caches, the accuracy cost against a float32 cache, and the runner's caches."""

from __future__ import annotations

import dataclasses
import json

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from llmc.engine.kv_cache import KV_CACHE_DTYPES, NUMPY_DTYPES
from llmc.engine.plan import ExecutionPlan, PluginCall, SegmentSpec
from llmc.engine.plugin import DOMAIN, INPUTS, OP_TYPE, OPTIONAL_ATTRIBUTES, SCHEMA_VERSION
from llmc.plugins import schema
from llmc.plugins.paged_attention.cpu import (
    dequantize_cpu,
    paged_attention_cpu,
    quantize_cpu,
)
from llmc.plugins.paged_attention.reference import (
    dequantize_kv,
    paged_attention_reference,
    quantize_kv,
)
from llmc.runtime.runners.step_inputs import StepInputs
from tests.plugins.test_paged_attention import (
    CASES,
    PARAMS,
    Batch,
    Case,
    attention_kwargs,
    make_batch,
)

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
# kv_cache_dtype: (numpy dtype, torch dtype, largest code magnitude)
QUANTIZED = {
    "fp8": (FP8, torch.float8_e4m3fn, 448.0),
    "int8": (np.dtype(np.int8), torch.int8, 127.0),
}


def float32_sweep() -> np.ndarray:
    """Every finite float32 whose low 12 bits are one of a few patterns: all signs, exponents
    (float32 subnormals included) and top 11 mantissa bits, so every E4M3 rounding position
    sees its exact ties (pattern 0), values just above and below them (1, 0x7FF, 0x801, 0xFFF)
    and random low bits. 7.3 million values."""
    high = np.arange(1 << 20, dtype=np.uint32) << 12
    random_low = np.random.default_rng(0).integers(0, 1 << 12, high.size, dtype=np.uint32)
    bits = np.concatenate(
        [high | low for low in (0, 1, 0x7FF, 0x800, 0x801, 0xFFF)] + [high | random_low]
    )
    values = bits.view(np.float32)
    return values[np.isfinite(values)]


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A torch view of ``array`` (torch has no ml_dtypes interop: fp8 goes through its bytes)."""
    if array.dtype == FP8:
        return torch.from_numpy(array.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(array)


def as_bytes(cache: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(cache, torch.Tensor):
        cache = cache.view(torch.uint8).numpy() if cache.element_size() == 1 else cache.numpy()
    return cache.view(np.uint8)


# ---- The write and the read on their own -------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.0123])
def test_fp8_write_is_saturating_round_to_nearest_even(scale: float) -> None:
    """The kernel's float32 -> E4M3FN against ml_dtypes' conversion (round to nearest even),
    saturated first: ml_dtypes gives NaN past 448, the cache saturates to +-448."""
    x = float32_sweep()
    with np.errstate(over="ignore"):  # the sweep's largest values overflow: saturated below
        expected = np.clip(x / np.float32(scale), -448, 448).astype(FP8)

    codes = quantize_cpu(x, FP8, scale)

    np.testing.assert_array_equal(codes.view(np.uint8), expected.view(np.uint8))
    assert not np.isnan(codes.astype(np.float32)).any()


def test_fp8_write_edge_values() -> None:
    x = np.array([448, 464, 464.01, 1e30, np.inf, -np.inf, 2**-6, 2**-9, 2**-10, 3 * 2**-10,
                  2**-10 + 2**-30, -0.0, 1.0625, 1.1875], np.float32)  # fmt: skip
    expected = [448, 448, 448, 448, 448, -448, 2**-6, 2**-9, 0, 2**-8, 2**-9, -0.0, 1.0, 1.25]

    got = quantize_cpu(x, FP8).astype(np.float32)

    np.testing.assert_array_equal(got, expected)
    assert np.signbit(got[-3])  # -0.0 keeps its sign
    assert np.isnan(quantize_cpu(np.array([np.nan], np.float32), FP8).astype(np.float32)).all()


@pytest.mark.parametrize("scale", [1.0, 0.0371])
def test_int8_write_is_saturating_round_half_to_even(scale: float) -> None:
    x = np.concatenate([float32_sweep(), np.arange(-130, 130.5, 0.5, dtype=np.float32)])
    with np.errstate(over="ignore"):  # np.round is half to even, as the cache
        expected = np.clip(np.round(x / np.float32(scale)), -127, 127).astype(np.int8)

    np.testing.assert_array_equal(quantize_cpu(x, np.int8, scale), expected)
    edges = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.5, 1e9, -np.inf], np.float32)
    assert quantize_cpu(edges, np.int8).tolist() == [0, 2, 2, 0, -2, 126, 127, 127, -127]


def test_fp8_read_table_holds_every_code() -> None:
    codes = np.arange(256, dtype=np.uint8).view(FP8)
    exact = codes.astype(np.float32)
    assert np.isnan(exact[[0x7F, 0xFF]]).all()  # E4M3FN's only NaNs; no infinities

    np.testing.assert_array_equal(dequantize_cpu(codes), exact)
    np.testing.assert_array_equal(dequantize_cpu(codes, 0.0123), exact * np.float32(0.0123))


def test_int8_read() -> None:
    codes = np.arange(-128, 128, dtype=np.int8)
    np.testing.assert_array_equal(dequantize_cpu(codes, 0.25), codes.astype(np.float32) * 0.25)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_reference_quantizes_as_the_kernel(kv_cache_dtype: str) -> None:
    numpy_dtype, torch_dtype, _ = QUANTIZED[kv_cache_dtype]
    x = float32_sweep()
    scale = 0.0123

    codes = quantize_kv(torch.from_numpy(x), torch_dtype, scale)

    np.testing.assert_array_equal(as_bytes(codes), as_bytes(quantize_cpu(x, numpy_dtype, scale)))
    all_codes = np.arange(256, dtype=np.uint8).view(numpy_dtype)
    np.testing.assert_array_equal(
        dequantize_kv(to_torch(all_codes), scale).numpy(), dequantize_cpu(all_codes, scale)
    )


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_cache_error_is_within_half_a_step(kv_cache_dtype: str) -> None:
    """Per element, the format's bound: E4M3 keeps 3 mantissa bits, so rounding moves a normal
    value by at most 2^-4 of itself and a subnormal one by 2^-10 (half of 2^-9) steps; int8 by
    half a step. Saturated values (past 448 or 127 steps) read back as the bound."""
    numpy_dtype, _, qmax = QUANTIZED[kv_cache_dtype]
    x = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)
    scale = 3.5 / qmax  # ~1 in 2000 values saturates

    error = np.abs(dequantize_cpu(quantize_cpu(x, numpy_dtype, scale), scale) - x)

    inside = np.abs(x) <= qmax * scale
    if kv_cache_dtype == "fp8":
        bound = np.maximum(2**-4 * np.abs(x), 2**-10 * scale)
    else:
        bound = np.full_like(x, scale / 2)
    assert (error[inside] <= bound[inside] * (1 + 1e-6)).all()  # 1e-6: float32's own rounding
    assert 0 < (~inside).sum() < 100
    np.testing.assert_allclose(error[~inside], np.abs(x[~inside]) - qmax * scale, rtol=1e-6)


# ---- Attention on a quantized cache -----------------------------------------------------


def quantized_batch(
    case: Case, seed: int, kv_cache_dtype: str
) -> tuple[Batch, Batch, dict[str, float]]:
    """(float32 batch, the same with its cache quantized, {k_scale, v_scale}). The scales map
    the largest key (value) of the step and its context to the largest code, as a calibration
    from amax would (vLLM: k_scale = amax / 448)."""
    batch = make_batch(case, seed)
    numpy_dtype, _, qmax = QUANTIZED[kv_cache_dtype]
    scales = {
        "k_scale": float(max(np.abs(batch.kv_pool[0]).max(), np.abs(batch.k).max()) / qmax),
        "v_scale": float(max(np.abs(batch.kv_pool[1]).max(), np.abs(batch.v).max()) / qmax),
    }
    pool = np.stack([quantize_cpu(batch.kv_pool[0], numpy_dtype, scales["k_scale"]),
                     quantize_cpu(batch.kv_pool[1], numpy_dtype, scales["v_scale"])])  # fmt: skip
    return batch, dataclasses.replace(batch, kv_pool=pool), scales


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_kernel_matches_reference_on_quantized_cache(case: Case, seed: int, kv_cache_dtype: str):
    _, batch, scales = quantized_batch(case, seed, kv_cache_dtype)
    tensors = [to_torch(a.copy()) for a in batch.arrays()]
    expected = paged_attention_reference(*tensors, **attention_kwargs(case), **scales)

    out = paged_attention_cpu(*batch.arrays(), **attention_kwargs(case), **scales)

    # The same codes read as the same float32 values: as tight as the float32 cache.
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(as_bytes(batch.kv_pool[0]), as_bytes(tensors[3]))
    np.testing.assert_array_equal(as_bytes(batch.kv_pool[1]), as_bytes(tensors[4]))


# Relative RMS rounding error of one cached element (data ~ N(0, 1)): FP8 E4M3 rounds to 3
# mantissa bits, an error uniform over +-1/16 of the value's binade [2^e, 2^(e+1)), whose RMS
# over the binade is 2^-3 / sqrt(12 * 7/3) = 2.4% of the values' RMS; int8 an error uniform over
# +-scale/2, RMS scale / sqrt(12) (about 1.2% at scale = amax / 127 with amax ~ 5).
FP8_RELATIVE_RMS = 2**-3 / (12 * 7 / 3) ** 0.5


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_quantized_cache_is_close_to_float32_cache(case: Case, seed: int, kv_cache_dtype: str):
    """The attention output moves by what the formats' rounding predicts, within 0.25x - 2x.

    Prediction: a key error of relative RMS s_k moves each score (q.k / sqrt(D), q ~ 2 N(0, 1)
    in make_batch) by ~2 s_k, which reweights the values; a value error s_v moves their
    p-weighted mean. Both are independent per key, so relative to the output's own RMS the
    error is ~sqrt((2 s_k)^2 + s_v^2): 5.3% for FP8, 2-3% for int8. Measured over these cases:
    0.4x - 1.2x of it (a window of one sees a single key, where scores do not matter; softcaps
    shrink score errors). Below 0.25x the cache was not quantized; above 2x, mis-scaled."""
    float_batch, batch, scales = quantized_batch(case, seed, kv_cache_dtype)
    float_out = paged_attention_cpu(*float_batch.arrays(), **attention_kwargs(case))

    out = paged_attention_cpu(*batch.arrays(), **attention_kwargs(case), **scales)

    if kv_cache_dtype == "fp8":
        error_k = error_v = FP8_RELATIVE_RMS
    else:
        error_k, error_v = scales["k_scale"] / 12**0.5, scales["v_scale"] / 12**0.5
    predicted = ((2 * error_k) ** 2 + error_v**2) ** 0.5
    relative_rms = np.sqrt(np.mean((out - float_out) ** 2) / np.mean(float_out**2))
    assert 0.25 * predicted < relative_rms < 2 * predicted


def test_bad_caches_and_scales_are_refused_before_any_write() -> None:
    case = CASES["chunked-prefill"]
    _, batch, scales = quantized_batch(case, 2, "fp8")
    before = as_bytes(batch.kv_pool).copy()
    arrays = list(batch.arrays())
    int8_values = arrays[4].view(np.int8)
    bfloat16_keys = np.zeros(arrays[3].shape, ml_dtypes.bfloat16)
    bad = {
        "key_cache and value_cache must have one dtype": ({4: int8_values}, scales),
        "key_cache must be one of": ({3: bfloat16_keys, 4: bfloat16_keys}, scales),
        "k_scale must be": ({}, scales | {"k_scale": 0.0}),
        "v_scale must be": ({}, scales | {"v_scale": float("nan")}),
        "k_scale must be ": ({}, scales | {"k_scale": 1e39}),  # inf in float32
    }
    for match, (replace, kwargs) in bad.items():
        spoiled = [replace.get(i, a) for i, a in enumerate(arrays)]
        with pytest.raises(ValueError, match=match):
            paged_attention_cpu(*spoiled, **attention_kwargs(case), **kwargs)
    np.testing.assert_array_equal(as_bytes(batch.kv_pool), before)


# ---- The plan and the runner ------------------------------------------------------------


def plugin_node(**optional: object) -> onnx.NodeProto:
    return helper.make_node(
        OP_TYPE, list(INPUTS), ["out"], domain=DOMAIN,
        plugin_namespace="llmc", plugin_version="1", num_heads=4, num_kv_heads=2, head_dim=16,
        scale=0.25, sliding_window=0, logit_softcap=0.0, block_size=4, layer_idx=0, **optional,
    )  # fmt: skip


def test_plugin_call_reads_the_optional_attributes() -> None:
    call = PluginCall.from_node(plugin_node(kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25))
    assert (call.kv_cache_dtype, call.k_scale, call.v_scale) == ("fp8", 0.5, 0.25)

    call = PluginCall.from_node(plugin_node())
    assert (call.kv_cache_dtype, call.k_scale, call.v_scale) == ("auto", 1.0, 1.0)
    assert set(KV_CACHE_DTYPES) == set(NUMPY_DTYPES)


def test_schema_accepts_nodes_with_and_without_the_optional_attributes() -> None:
    schema.register_schema()
    context = onnx.checker.C.CheckerContext()
    context.ir_version = onnx.IR_VERSION
    context.opset_imports = {"": 17, DOMAIN: SCHEMA_VERSION}
    for node in (plugin_node(), plugin_node(kv_cache_dtype="int8", k_scale=0.5, v_scale=0.5)):
        onnx.checker.check_node(node, context)  # checks the attributes against the schema
    with pytest.raises(onnx.checker.ValidationError, match="kv_cache_type"):
        onnx.checker.check_node(plugin_node(kv_cache_type="fp8"), context)
    opset = schema.defs.get_schema(OP_TYPE, SCHEMA_VERSION, DOMAIN)
    assert not any(opset.attributes[name].required for name in OPTIONAL_ATTRIBUTES)


def test_plan_json_without_the_new_fields_still_loads() -> None:
    plan = ExecutionPlan([], [PluginCall.from_node(plugin_node(kv_cache_dtype="int8"))], "x")
    old = json.loads(plan.to_json())
    for name in ("kv_cache_dtype", "k_scale", "v_scale"):
        del old["plugins"][0][name]

    (call,) = ExecutionPlan.from_json(json.dumps(old)).plugins

    assert (call.kv_cache_dtype, call.k_scale, call.v_scale) == ("auto", 1.0, 1.0)
    assert ExecutionPlan.from_json(plan.to_json()) == plan


HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, VOCAB = 4, 2, 16, 4, 32
# Per layer (k_scale, v_scale) of each quantized dtype: the keys and values are ~N(0, 1).
SCALES = {"fp8": [(4 / 448, 3 / 448), (5 / 448, 2 / 448)],
          "int8": [(4 / 127, 3 / 127), (5 / 127, 2 / 127)]}  # fmt: skip


def write_engine(engine_dir, kv_cache_dtype: str) -> ExecutionPlan:
    """A two-layer engine by hand: segment 0 embeds input_ids into q0, k0, v0; segment 1 projects
    attn0 into q1, k1, v1; segment 2 projects attn1 to the logits. Written as the compiler
    writes one (plan.json, segments/*.onnx)."""
    rng = np.random.default_rng(7)
    widths = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}

    def weight(name: str, shape: tuple[int, int], fan_in: int) -> onnx.TensorProto:
        value = rng.standard_normal(shape) / np.sqrt(fan_in)  # outputs ~ N(0, 1)
        return onnx.numpy_helper.from_array(value.astype(np.float32), name)

    def save(index: int, source: str, outputs: dict[str, int], op: str) -> SegmentSpec:
        dtype = TensorProto.INT64 if source == "input_ids" else TensorProto.FLOAT
        shape = ["T"] if source == "input_ids" else ["T", HEADS * HEAD_DIM]
        rows = VOCAB if source == "input_ids" else HEADS * HEAD_DIM
        fan_in = 1 if source == "input_ids" else rows  # an embedding table, or a projection
        weights = [weight(f"w{index}_{n}", (rows, w), fan_in) for n, w in outputs.items()]
        nodes = [
            helper.make_node(op, [w.name, source] if op == "Gather" else [source, w.name], [name])
            for w, name in zip(weights, outputs, strict=True)
        ]
        graph = helper.make_graph(
            nodes, f"segment{index}", [helper.make_tensor_value_info(source, dtype, shape)],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["T", w])
             for n, w in outputs.items()], initializer=weights,
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        (engine_dir / "segments").mkdir(exist_ok=True)
        onnx.save(model, engine_dir / "segments" / f"{index}.onnx")
        return SegmentSpec(f"segments/{index}.onnx", [source], list(outputs))

    segments = [
        save(0, "input_ids", {f"{n}0": w for n, w in widths.items()}, "Gather"),
        save(1, "attn0", {f"{n}1": w for n, w in widths.items()}, "MatMul"),
        save(2, "attn1", {"logits": VOCAB}, "MatMul"),
    ]
    plugins = []
    for layer in range(2):
        names = [f"q{layer}", f"k{layer}", f"v{layer}", f"key_cache.{layer}",
                 f"value_cache.{layer}", *INPUTS[5:]]  # fmt: skip
        k_scale, v_scale = SCALES[kv_cache_dtype][layer] if kv_cache_dtype in SCALES else (1.0, 1.0)
        plugins.append(PluginCall(
            layer_idx=layer, inputs=names, output=f"attn{layer}", num_heads=HEADS,
            num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, scale=HEAD_DIM**-0.5, sliding_window=0,
            logit_softcap=0.0, block_size=BLOCK_SIZE, kv_cache_dtype=kv_cache_dtype,
            k_scale=k_scale, v_scale=v_scale,
        ))  # fmt: skip
    plan = ExecutionPlan(segments, plugins, "logits")
    (engine_dir / "plan.json").write_text(plan.to_json())
    return plan


def step_inputs(seq_len: int, num_new: int, block_table: list[int]) -> StepInputs:
    positions = np.arange(seq_len - num_new, seq_len)
    slots = [block_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions]
    return StepInputs(
        input_ids=(positions * 7 % VOCAB).astype(np.int64),
        positions=positions.astype(np.int64),
        seq_lens=np.array([seq_len], np.int32),
        query_start_loc=np.array([0, num_new], np.int32),
        block_tables=np.array([block_table], np.int32),
        slot_mapping=np.array(slots, np.int64),
        logits_indices=np.array([num_new - 1], np.int64),
    )


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_runner_allocates_the_cache_dtype_and_passes_the_scales(tmp_path, kv_cache_dtype: str):
    """Each layer's caches in the plan's dtype, written in place; every layer's attention and
    cache bytes equal the reference's with that layer's scales, over a prefill and a decode."""
    from llmc.runtime.runners.ort_runner import OrtRunner

    plan = write_engine(tmp_path, kv_cache_dtype)
    runner = OrtRunner(tmp_path, num_blocks=6)

    shape = (6, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    assert {name: (c.dtype, c.shape) for name, c in runner.kv_caches.items()} == {
        name: (NUMPY_DTYPES[kv_cache_dtype], shape) for p in plan.plugins for name in p.inputs[3:5]
    }
    addresses = {name: c.ctypes.data for name, c in runner.kv_caches.items()}
    torch_dtype = QUANTIZED[kv_cache_dtype][1] if kv_cache_dtype in QUANTIZED else torch.float32
    reference_caches = {name: torch.zeros(shape, dtype=torch_dtype) for name in addresses}
    for step in (step_inputs(7, 7, [4, 1]), step_inputs(8, 1, [4, 1])):
        env = runner.run_step(step)
        metadata = [torch.from_numpy(getattr(step, name)) for name in INPUTS[5:]]
        for p in plan.plugins:
            expected = paged_attention_reference(
                *(torch.from_numpy(env[name]) for name in p.inputs[:3]),
                *(reference_caches[name] for name in p.inputs[3:5]), *metadata,
                num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, scale=p.scale,
                sliding_window=None, logit_softcap=None, k_scale=p.k_scale, v_scale=p.v_scale,
            )  # fmt: skip
            np.testing.assert_allclose(env[p.output], expected.numpy(), atol=1e-5, rtol=1e-4)
        for name, cache in runner.kv_caches.items():
            np.testing.assert_array_equal(as_bytes(cache), as_bytes(reference_caches[name]))
    assert {name: c.ctypes.data for name, c in runner.kv_caches.items()} == addresses
    assert as_bytes(runner.kv_caches["key_cache.1"]).any()  # the step did write


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_pool_sizing_counts_the_bytes_the_runner_allocates(tmp_path, kv_cache_dtype: str):
    """A block costs what the runner allocates for it, so one budget holds 4x as many blocks of a
    1-byte (fp8, int8) cache as of a float32 one."""
    from types import SimpleNamespace

    from llmc.runtime.runners.engine_loader import kv_bytes_per_block, plan_num_blocks
    from llmc.runtime.runners.ort_runner import OrtRunner

    write_engine(tmp_path, kv_cache_dtype)
    runner = OrtRunner(tmp_path, num_blocks=6)
    manifest = SimpleNamespace(  # the fields sizing reads; a build records "auto" as float32
        kv_cache_dtype="float32" if kv_cache_dtype == "auto" else kv_cache_dtype,
        num_layers=2, block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
        max_seq_len=4 * BLOCK_SIZE, max_batch=64,
    )  # fmt: skip
    assert 6 * kv_bytes_per_block(manifest) == sum(c.nbytes for c in runner.kv_caches.values())
    float32_blocks = 10 * 2 * 2 * BLOCK_SIZE * KV_HEADS * HEAD_DIM * 4  # bytes
    expected = 10 if kv_cache_dtype == "auto" else 40
    assert plan_num_blocks(manifest, None, float32_blocks) == expected


def test_runner_refuses_an_unknown_cache_dtype(tmp_path) -> None:
    from llmc.runtime.runners.ort_runner import OrtRunner

    write_engine(tmp_path, "fp16")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, int8"):
        OrtRunner(tmp_path, num_blocks=6)
