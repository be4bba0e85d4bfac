"""llmc::PagedAttention as an ONNX Runtime custom op (ort_op.c) in a real ORT session: against
the torch reference and the ctypes kernel, the caches written in place, bad inputs refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from llmc.engine.kv_cache import NUMPY_DTYPES
from llmc.engine.plugin import INPUTS, OP_TYPE
from llmc.plugins import schema
from llmc.plugins.paged_attention import ort_op
from llmc.plugins.paged_attention.cpu import paged_attention_cpu
from llmc.runtime.runners.ort_env import session_options
from tests.plugins.test_paged_attention import (
    CASES,
    PARAMS,
    Batch,
    Case,
    attention_kwargs,
    make_batch,
    run_reference,
)

CACHE_TYPES = {
    "auto": TensorProto.FLOAT,
    "fp8": TensorProto.FLOAT8E4M3FN,
    "int8": TensorProto.INT8,
}
METADATA_TYPES = (TensorProto.INT32,) * 3 + (TensorProto.INT64,)
SCALES = {"auto": (1.0, 1.0), "fp8": (0.011, 0.017), "int8": (0.021, 0.027)}


def one_node_model(
    case: Case, kv_cache_dtype: str = "auto", attributes: dict | None = None, cache_type=None
) -> onnx.ModelProto:
    """A graph of one PagedAttention node; inputs named as in INPUTS. ``attributes``
    override the node's; ``cache_type`` the caches' declared element type."""
    k_scale, v_scale = SCALES[kv_cache_dtype]
    attrs = dict(
        num_heads=case.num_heads, num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
        scale=case.head_dim**-0.5, sliding_window=case.sliding_window or 0,
        logit_softcap=case.logit_softcap or 0.0, block_size=case.block_size, layer_idx=0,
        kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
        plugin_namespace="llmc", plugin_version="1",
    ) | (attributes or {})  # fmt: skip
    cache_type = cache_type or CACHE_TYPES[kv_cache_dtype]
    types = [TensorProto.FLOAT] * 3 + [cache_type] * 2 + list(METADATA_TYPES)
    shapes = [["T", "QW"], ["T", "KW"], ["T", "KW"], ["N", "S", "KVH", "D"],
              ["N", "S", "KVH", "D"], ["B"], ["B1"], ["B", "M"], ["T"]]  # fmt: skip
    node = helper.make_node(OP_TYPE, list(INPUTS), ["out"], domain="llmc", **attrs)
    graph = helper.make_graph(
        [node],
        "paged_attention",
        [
            helper.make_tensor_value_info(n, t, shape)
            for n, t, shape in zip(INPUTS, types, shapes, strict=True)
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["T", "QW"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("llmc", 1)]
    )
    model.ir_version = 10
    return model


def one_node_session(case: Case, kv_cache_dtype: str = "auto", **model_options):
    """An ORT session of :func:`one_node_model` with the custom op registered."""
    model = one_node_model(case, kv_cache_dtype, **model_options)
    opts = session_options(2)  # the process's global pool, as every llmc session
    assert ort_op.register(opts), "the custom op library is not built (see setup.py)"
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def feed(batch: Batch, caches: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """The batch as a feed; the caches as OrtValues over the numpy memory (FP8 has no numpy
    type ORT accepts)."""
    arrays = list(batch.arrays())
    if caches is not None:
        arrays[3:5] = caches
    for i in (3, 4):
        if arrays[i].dtype == NUMPY_DTYPES["fp8"]:
            arrays[i] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                arrays[i].view(np.uint8), TensorProto.FLOAT8E4M3FN
            )
        else:
            arrays[i] = ort.OrtValue.ortvalue_from_numpy(arrays[i])
    return dict(zip(INPUTS, arrays, strict=True))


@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_op_matches_reference_and_writes_the_cache_in_place(case: Case, seed: int) -> None:
    batch = make_batch(case, seed)
    expected, ref_keys, ref_values = run_reference(case, batch)

    (out,) = one_node_session(case).run(["out"], feed(batch))

    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(batch.kv_pool[0], ref_keys.numpy())
    np.testing.assert_array_equal(batch.kv_pool[1], ref_values.numpy())


@pytest.mark.parametrize("fpmath_mode", ["strict", "bf16"])
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
@pytest.mark.parametrize("name", ["mixed-gqa4", "gemma-mqa-d256", "softcap-window", "random-3"])
def test_op_on_a_quantized_cache_equals_the_ctypes_kernel(
    name: str, kv_cache_dtype: str, fpmath_mode: str
) -> None:
    """Same kernel, same scales: the op's output and cache bytes equal the ctypes binding's;
    with bf16 math (decoded rows rounded again), within the rounding of q, k, v and the weights
    of the strict output (mean 1.2e-3 measured over the float32 cases)."""
    case = CASES[name]
    batch = make_batch(case, 5)
    dtype = NUMPY_DTYPES[kv_cache_dtype]
    op_caches = tuple(np.zeros(batch.kv_pool.shape[1:], dtype) for _ in range(2))
    kernel_caches = tuple(c.copy() for c in op_caches)
    k_scale, v_scale = SCALES[kv_cache_dtype]
    arrays = list(batch.arrays())
    arrays[3:5] = kernel_caches

    session = one_node_session(case, kv_cache_dtype, attributes={"fpmath_mode": fpmath_mode})
    (out,) = session.run(["out"], feed(batch, op_caches))
    kwargs = attention_kwargs(case) | {"k_scale": k_scale, "v_scale": v_scale}
    strict_caches = tuple(c.copy() for c in op_caches)
    expected = paged_attention_cpu(*arrays, **kwargs, fpmath_mode=fpmath_mode)
    arrays[3:5] = strict_caches
    strict = paged_attention_cpu(*arrays, **kwargs)

    np.testing.assert_array_equal(out, expected)
    error = np.abs(out - strict)
    assert error.max() < 5e-2 and error.mean() < 3e-3, (error.max(), error.mean())
    for written, kernel_written in zip(op_caches, kernel_caches, strict=True):
        assert written.view(np.uint8).any()
        np.testing.assert_array_equal(written.view(np.uint8), kernel_written.view(np.uint8))


@pytest.mark.parametrize("name", ["mixed-gqa4", "gemma-mqa-d256", "long-prefill-mqa", "random-3"])
def test_op_reads_fpmath_mode_as_the_ctypes_kernel_takes_it(name: str) -> None:
    """The node's fpmath_mode reaches the kernel: the op's bf16 output equals the ctypes
    binding's bf16 output bit for bit (each runs the AMX path where the host has it)."""
    case = CASES[name]
    batch, kernel_batch = make_batch(case, 7), make_batch(case, 7)

    (out,) = one_node_session(case, attributes={"fpmath_mode": "bf16"}).run(["out"], feed(batch))
    expected = paged_attention_cpu(
        *kernel_batch.arrays(), **attention_kwargs(case), fpmath_mode="bf16"
    )

    np.testing.assert_array_equal(out, expected)


# name: (index into Batch.arrays(), how to spoil it, ORT's error message must contain)
BAD_INPUTS = {
    "seq-lens-short": (5, lambda s: s - 30, "seq_lens"),
    "qsl-decreasing": (6, lambda s: s[::-1].copy(), "query_start_loc"),
    "block-id": (7, lambda t: t + 1000, "block id outside"),
    "slot": (8, lambda s: s + 10**6, "slot outside"),
    "k-rows": (1, lambda k: k[:-1].copy(), r"q, k, v must be \[T, 256\], \[T, 128\]"),
    "cache-block-size": (3, lambda c: c[:, :8].copy(), "must both be"),
    "qsl-length": (6, lambda s: s[:-1].copy(), r"query_start_loc must be \[B\+1\]"),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_inputs_fail_the_run_before_any_write(name: str) -> None:
    case = CASES["chunked-prefill"]
    index, spoil, match = BAD_INPUTS[name]
    batch = make_batch(case, 2)
    pool_before = batch.kv_pool.copy()
    arrays = dict(zip(INPUTS, batch.arrays(), strict=True))
    arrays[INPUTS[index]] = spoil(arrays[INPUTS[index]])

    with pytest.raises(Exception, match=f"PagedAttention: .*{match}"):
        one_node_session(case).run(["out"], arrays)
    np.testing.assert_array_equal(batch.kv_pool, pool_before)


def test_a_cache_of_another_dtype_than_the_attribute_fails_the_run() -> None:
    case = CASES["chunked-prefill"]
    batch = make_batch(case, 2)
    arrays = dict(zip(INPUTS, batch.arrays(), strict=True))
    for name in ("key_cache", "value_cache"):
        arrays[name] = arrays[name].astype(np.int8)
    session = one_node_session(case, cache_type=TensorProto.INT8)  # attribute: "auto"

    with pytest.raises(
        Exception, match="PagedAttention: key_cache has ONNX element type 3, expected 1"
    ):
        session.run(["out"], arrays)


@pytest.mark.parametrize(
    ("attributes", "match"),
    [
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype must be auto, fp8 or int8, got 'int4'"),
        ({"num_heads": 3}, "bad attributes num_heads=3 num_kv_heads=2"),
        ({"fpmath_mode": "tf32"}, "fpmath_mode must be strict or bf16, got 'tf32'"),
        ({"fpmath_mode": "strict" * 8}, r"fpmath_mode must be strict or bf16, got '\(too long\)'"),
        ({"kv_cache_dtype": "auto" * 8}, r"kv_cache_dtype must be auto, fp8 or int8, got '\(too"),
    ],
)
def test_bad_attributes_fail_at_session_creation(attributes: dict, match: str) -> None:
    case = CASES["chunked-prefill"]
    with pytest.raises(Exception, match=match):
        one_node_session(case, attributes=attributes)


def test_library_is_refused_when_built_from_older_sources(monkeypatch) -> None:
    ort_op.library_path.cache_clear()
    monkeypatch.setattr(ort_op, "_sources_sha256", lambda: "0" * 64)
    try:
        with pytest.warns(UserWarning, match="built from older sources"):
            assert ort_op.library_path() is None
        assert not ort_op.register(ort.SessionOptions())
    finally:
        ort_op.library_path.cache_clear()


def test_schema_and_op_agree_on_the_inputs() -> None:
    """The ONNX checker (schema.py) accepts the node the op runs."""
    schema.register_schema()
    for kv_cache_dtype in CACHE_TYPES:
        model = one_node_model(CASES["mha"], kv_cache_dtype)
        onnx.checker.check_model(model, full_check=True)
        one_node_session(CASES["mha"], kv_cache_dtype)


def test_a_step_without_new_tokens_returns_an_empty_output() -> None:
    case = Case(((10, 0), (7, 0)), 4, 2, 32, 4)
    batch = make_batch(case, 9)
    pool_before = batch.kv_pool.copy()

    (out,) = one_node_session(case).run(["out"], feed(batch))

    assert out.shape == (0, 4 * 32)
    np.testing.assert_array_equal(batch.kv_pool, pool_before)
