"""The Triton paged-attention kernel under TRITON_INTERPRET=1 against the torch reference, and the
TensorRT plugin's parts that run without TensorRT (DESIGN §3 and §6)."""

from __future__ import annotations

import os

# Before the first import of the kernel module in this process: @triton.jit reads it there.
os.environ["TRITON_INTERPRET"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from onnx import helper  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.9.0)")

from llmc.engine.plugin import (  # noqa: E402
    DOMAIN,
    OP_TYPE,
    PLUGIN_ATTRIBUTES,
    PLUGIN_ID,
    PLUGIN_VERSION,
    PluginAttributes,
)
from llmc.errors import LlmcError  # noqa: E402
from llmc.plugins.paged_attention.reference import (  # noqa: E402
    paged_attention_reference,
    quantize_kv,
)
from llmc.plugins.paged_attention.triton_launch import paged_attention_triton  # noqa: E402
from llmc.plugins.paged_attention.trt_plugin import TensorSpec, describe_outputs  # noqa: E402
from llmc.plugins.paged_attention.trt_register import register  # noqa: E402
from tests.plugins.test_paged_attention import Case, make_batch  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CACHES = {"auto": None, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
SCALES = {"auto": (1.0, 1.0), "fp8": (0.02, 0.03), "int8": (0.031, 0.027)}
# (atol, rtol) on the output against the reference run on the same rounded inputs. The kernel
# rounds P to the 16-bit dtype for P V (tensor-core operands; the reference keeps float32), and
# the interpreter's bf16 store truncates where torch rounds to nearest (1 ulp: 2^-7 relative).
TOLERANCE = {"float32": (1e-5, 1e-5), "float16": (1e-3, 2e-3), "bfloat16": (1e-2, 1.6e-2)}

FIXED = {
    # L = k*block_size and k*block_size +- 1, in decode and in prefill.
    "decode-block-boundaries": Case(((15, 1), (16, 1), (17, 1), (32, 1), (33, 1), (1, 1)),
                                    4, 4, 16, 16),
    "prefill-block-boundaries": Case(((7, 7), (8, 8), (9, 9), (16, 16)), 8, 2, 32, 8),
    "chunked-prefill": Case(((40, 24), (33, 17)), 4, 1, 16, 8),
    "mixed-gqa4": Case(((15, 15), (16, 1), (17, 1), (50, 20), (3, 3)), 8, 2, 16, 16),
    "gqa8-mqa": Case(((24, 1), (16, 16), (9, 3)), 8, 1, 32, 4),
    "gqa8": Case(((41, 9), (18, 1)), 16, 2, 16, 16),
    "mha": Case(((20, 5), (9, 1)), 2, 2, 16, 8),
    "gqa3-head-dim-24": Case(((30, 10), (21, 1)), 6, 2, 24, 8),
    "window-smaller": Case(((60, 20), (45, 1), (33, 33)), 4, 1, 16, 16, sliding_window=8),
    "window-one": Case(((20, 20), (5, 1)), 2, 1, 16, 4, sliding_window=1),
    "window-block": Case(((50, 10), (33, 1)), 4, 2, 16, 16, sliding_window=16),
    "window-larger": Case(((40, 12), (25, 1)), 4, 2, 16, 8, sliding_window=1000),
    "softcap": Case(((40, 40), (25, 1)), 8, 2, 32, 16, logit_softcap=2.0),
    "softcap-window": Case(((70, 30), (90, 1)), 4, 1, 32, 16, 17, logit_softcap=30.0),
    "sequence-without-new-tokens": Case(((10, 0), (12, 3), (7, 0)), 4, 2, 16, 4),
    "block-size-1": Case(((9, 4), (3, 1)), 2, 1, 16, 1),
    "block-size-64": Case(((100, 40), (65, 1)), 4, 2, 16, 64),
}  # fmt: skip


def random_case(seed: int) -> Case:
    rng = np.random.default_rng(5000 + seed)
    num_kv_heads = int(rng.choice([1, 2]))
    group = int(rng.choice([1, 4, 8]))
    block_size = int(rng.choice([4, 8, 16]))
    seqs = []
    for _ in range(int(rng.integers(1, 5))):
        # Lengths near block boundaries half of the time.
        length = int(rng.integers(1, 70))
        if rng.random() < 0.5:
            length = max(1, block_size * int(rng.integers(1, 5)) + int(rng.integers(-1, 2)))
        seqs.append((length, 1 if rng.random() < 0.5 else int(rng.integers(1, length + 1))))
    return Case(
        seqs=tuple(seqs),
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_dim=int(rng.choice([16, 32])),
        block_size=block_size,
        sliding_window=None if rng.random() < 0.5 else int(rng.integers(1, 40)),
        logit_softcap=None if rng.random() < 0.6 else float(rng.uniform(1.0, 30.0)),
    )


def _params() -> list:
    """58 cases: each fixed case in two activation dtypes (all three over the set), quantized
    caches, random cases; tiles alternate between the default (16 rows, 32 keys) and 16 keys."""
    dtypes = list(DTYPES)
    cases = []
    for i, (name, case) in enumerate(FIXED.items()):
        for dtype in (dtypes[i % 3], dtypes[(i + 1) % 3]):
            cases.append((f"{name}-{dtype}", case, dtype, "auto"))
    quantized = ("mixed-gqa4", "gqa8-mqa", "softcap-window", "decode-block-boundaries")
    for i, name in enumerate(quantized):  # quantized caches with 16-bit and float32 activations
        for kv in ("fp8", "int8"):
            dtype = dtypes[(2 * i + (kv == "int8")) % 3]
            cases.append((f"{name}-{dtype}-{kv}", FIXED[name], dtype, kv))
    combos = [(d, kv) for kv in CACHES for d in DTYPES]
    for seed in range(16):
        dtype, kv = combos[seed % len(combos)]
        cases.append((f"random-{seed}-{dtype}-{kv}", random_case(seed), dtype, kv))
    return [
        pytest.param(case, dtype, kv, 16 if i % 2 else 32, id=name)
        for i, (name, case, dtype, kv) in enumerate(cases)
    ]


def step_tensors(case: Case, seed: int, dtype: torch.dtype, kv: str) -> list[torch.Tensor]:
    """A random step as torch tensors in the tested dtypes (caches quantized with the scales)."""
    arrays = [torch.from_numpy(a.copy()) for a in make_batch(case, seed).arrays()]
    for i in range(3):
        arrays[i] = arrays[i].to(dtype)
    k_scale, v_scale = SCALES[kv]
    cache_dtype = CACHES[kv] or dtype
    arrays[3] = quantize_kv(arrays[3], cache_dtype, k_scale).contiguous()
    arrays[4] = quantize_kv(arrays[4], cache_dtype, v_scale).contiguous()
    return arrays


def kwargs_of(case: Case, kv: str) -> dict:
    k_scale, v_scale = SCALES[kv]
    return dict(num_heads=case.num_heads, num_kv_heads=case.num_kv_heads,
                head_dim=case.head_dim, scale=case.head_dim**-0.5,
                sliding_window=case.sliding_window, logit_softcap=case.logit_softcap,
                k_scale=k_scale, v_scale=v_scale)  # fmt: skip


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """The same elements as integers of their size: bit-for-bit comparisons (NaN, -0.0)."""
    return cache.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[cache.element_size()])


@pytest.mark.parametrize(("case", "dtype", "kv", "block_n"), _params())
def test_kernel_matches_reference(case: Case, dtype: str, kv: str, block_n: int) -> None:
    inputs = step_tensors(case, len(case.seqs) * 7 + case.head_dim, DTYPES[dtype], kv)
    expected_inputs = [t.clone() for t in inputs]
    before = [inputs[3].clone(), inputs[4].clone()]
    pointers = [inputs[3].data_ptr(), inputs[4].data_ptr()]

    out = paged_attention_triton(*inputs, **kwargs_of(case, kv), block_n=block_n)
    expected = paged_attention_reference(*expected_inputs, **kwargs_of(case, kv))

    assert out.dtype == DTYPES[dtype] and out.shape == expected.shape
    error = (out.float() - expected.float()).abs()
    atol, rtol = TOLERANCE[dtype]
    assert (error <= atol + rtol * expected.float().abs()).all(), f"max abs error {error.max()}"
    print(f"\nmax-abs-error {dtype} {kv}: {error.max().item():.3g}")
    # The caches: written in place (same storage), bit for bit as the reference writes them.
    assert [inputs[3].data_ptr(), inputs[4].data_ptr()] == pointers
    assert torch.equal(as_bytes(inputs[3]), as_bytes(expected_inputs[3]))
    assert torch.equal(as_bytes(inputs[4]), as_bytes(expected_inputs[4]))
    # ... and independently: the slots hold quantize(k), every other row is untouched.
    k_scale, v_scale = SCALES[kv]
    kvh, d = case.num_kv_heads, case.head_dim
    slots = inputs[8]
    for cache, old, new, scale in ((inputs[3], before[0], inputs[1], k_scale),
                                   (inputs[4], before[1], inputs[2], v_scale)):  # fmt: skip
        rows, old_rows = as_bytes(cache).view(-1, kvh, d), as_bytes(old).view(-1, kvh, d)
        written = as_bytes(quantize_kv(new.view(-1, kvh, d), cache.dtype, scale))
        assert torch.equal(rows[slots], written)
        untouched = torch.ones(rows.shape[0], dtype=torch.bool)
        untouched[slots] = False
        assert torch.equal(rows[untouched], old_rows[untouched])


def edge_values() -> torch.Tensor:
    """FP8 and int8 rounding edges: E4M3 ties in every binade (subnormal ones too), values just
    either side of them, int8 ties, saturation, signed zero, float32 subnormals."""
    steps = [2.0 ** (e - 3) for e in range(-6, 9)]
    ties = [(m + 0.5) * s for s in steps for m in range(8, 16)] + [
        (i + 0.5) * 2**-9 for i in range(8)
    ]
    near = [t * (1 + 2**-20) for t in ties] + [t * (1 - 2**-20) for t in ties]
    ints = [n + 0.5 for n in range(-130, 130)]
    special = [448, 464, 500, 1e30, float("inf"), 2**-6, 2**-9, 2**-10, 1e-40, 0.0, -0.0, 127.5]
    values = torch.tensor(ties + near + ints + special, dtype=torch.float32)
    values = torch.cat([values, -values])
    return torch.cat([values, torch.zeros((-values.numel()) % 16)])  # whole rows of D=16


# inf inputs make inf - inf inside the interpreter's rounding helper; the code saturates anyway.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(
    ("kv", "scale"), [("fp8", 1.0), ("fp8", 0.0123), ("int8", 1.0), ("int8", 0.0371)]
)
def test_cache_write_rounds_and_saturates_as_the_reference(kv: str, scale: float) -> None:
    values = edge_values() * scale  # x / scale then lands on the edges (up to float32 rounding)
    num_tokens = values.numel() // 16
    case = Case(((num_tokens, num_tokens),), 1, 1, 16, 16)
    inputs = step_tensors(case, 0, torch.float32, kv)
    inputs[0].zero_()  # q = 0: the output is irrelevant here, only the written codes
    inputs[1].copy_(values.view(num_tokens, 16))
    inputs[2].copy_(-values.view(num_tokens, 16))
    reference_inputs = [t.clone() for t in inputs]
    kwargs = dict(kwargs_of(case, kv), k_scale=scale, v_scale=scale)

    paged_attention_triton(*inputs, **kwargs, block_n=16)
    paged_attention_reference(*reference_inputs, **kwargs)

    assert torch.equal(as_bytes(inputs[3]), as_bytes(reference_inputs[3]))
    assert torch.equal(as_bytes(inputs[4]), as_bytes(reference_inputs[4]))


def test_empty_step_and_bad_inputs() -> None:
    case = FIXED["mha"]
    inputs = step_tensors(case, 0, torch.float32, "auto")
    empty = [inputs[0][:0], inputs[1][:0], inputs[2][:0], *inputs[3:5], inputs[5][:0],
             inputs[6][:1] * 0, inputs[7][:0], inputs[8][:0]]  # fmt: skip
    assert paged_attention_triton(*empty, **kwargs_of(case, "auto")).shape == (0, 32)

    bad = {
        "q": [inputs[0].to(torch.int32), *inputs[1:]],
        "key_cache": [*inputs[:3], inputs[3].to(torch.float16), *inputs[4:]],
        "value_cache": [*inputs[:4], inputs[4].transpose(0, 1), *inputs[5:]],
        "slot_mapping": [*inputs[:8], inputs[8].to(torch.int32)],
    }
    for name, arguments in bad.items():
        with pytest.raises(ValueError, match=name):
            paged_attention_triton(*arguments, **kwargs_of(case, "auto"))
    with pytest.raises(ValueError, match="multiple"):
        paged_attention_triton(*inputs, **dict(kwargs_of(case, "auto"), num_kv_heads=3))


# ---- The TensorRT plugin without TensorRT -----------------------------------------------------


def node(**overrides: object):
    attributes = dict(plugin_namespace=DOMAIN, plugin_version=PLUGIN_VERSION, num_heads=8,
                      num_kv_heads=2, head_dim=64, scale=0.125, sliding_window=0,
                      logit_softcap=0.0, block_size=16, layer_idx=3)  # fmt: skip
    attributes.update(overrides)
    return helper.make_node(OP_TYPE, [f"i{i}" for i in range(9)], ["o"], domain=DOMAIN,
                            name="attn3", **attributes)  # fmt: skip


def test_plugin_id_and_attributes_follow_the_schema() -> None:
    assert PLUGIN_ID == "llmc::PagedAttention" and PLUGIN_VERSION == "1"
    attributes = PluginAttributes.from_node(node(kv_cache_dtype="fp8", k_scale=0.5))
    # Optional attributes are filled; every one is written, in the descriptor's order.
    assert list(attributes.node_attributes()) == [name for name, _ in PLUGIN_ATTRIBUTES]
    assert attributes.node_attributes()["kv_cache_dtype"] == "fp8"
    assert (attributes.k_scale, attributes.v_scale, attributes.layer_idx) == (0.5, 1.0, 3)
    assert PluginAttributes.from_node(node()).kv_cache_dtype == "auto"
    bad_node = node()
    bad_node.attribute.remove(next(a for a in bad_node.attribute if a.name == "head_dim"))
    with pytest.raises(LlmcError, match="head_dim"):
        PluginAttributes.from_node(bad_node)
    with pytest.raises(LlmcError, match="multiple"):
        PluginAttributes.from_node(node(num_kv_heads=3))


def specs(dtype: str, cache: str) -> list[TensorSpec]:
    return [TensorSpec(("T", 512), dtype), TensorSpec(("T", 128), dtype),
            TensorSpec(("T", 128), dtype), TensorSpec((100, 16, 2, 64), cache),
            TensorSpec((100, 16, 2, 64), cache), TensorSpec(("B",), "int32"),
            TensorSpec(("B+1",), "int32"), TensorSpec(("B", 32), "int32"),
            TensorSpec(("T",), "int64")]  # fmt: skip


def test_descriptor_gives_output_like_q_and_the_caches_aliased() -> None:
    outputs = describe_outputs(specs("float16", "float16"), PluginAttributes.from_node(node()))
    assert outputs == (TensorSpec(("T", 512), "float16"), TensorSpec((100, 16, 2, 64), "float16"),
                       TensorSpec((100, 16, 2, 64), "float16"))  # fmt: skip
    fp8 = PluginAttributes.from_node(node(kv_cache_dtype="fp8"))
    assert describe_outputs(specs("bfloat16", "float8e4m3fn"), fp8)[1].dtype == "float8e4m3fn"
    with pytest.raises(LlmcError, match="key_cache must be float8e4m3fn"):
        describe_outputs(specs("bfloat16", "bfloat16"), fp8)
    with pytest.raises(LlmcError, match="dim 1 = 512, the attributes say 256"):
        describe_outputs(specs("float16", "float16"), PluginAttributes.from_node(node(head_dim=32)))
    with pytest.raises(LlmcError, match="q must be one of"):
        describe_outputs(specs("int8", "int8"), PluginAttributes.from_node(node()))


def test_register_without_tensorrt_names_what_is_missing() -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorrt is installed here: this test is for machines without it")
    with pytest.raises(LlmcError, match="TensorRT's Python package .*No module named 'tensorrt'"):
        register()


def test_aot_compiles_to_ptx_for_sm80_and_sm90() -> None:
    """The AOT path up to TensorRT: PTX for two architectures, compiled without a GPU (in a
    process without TRITON_INTERPRET, which turns @triton.jit kernels into interpreter ones)."""
    script = textwrap.dedent("""
        import re
        from llmc.plugins.paged_attention.trt_aot import compile_aot
        from llmc.engine.plugin import PluginAttributes
        attributes = PluginAttributes(8, 1, 32, 0.17, 0, 30.0, 16, 0, "fp8", 0.02, 0.03)
        for arch, dtype in ((80, "float16"), (90, "bfloat16")):
            kernel = compile_aot(attributes, dtype, arch)
            entry = kernel.ptx[kernel.ptx.index(".entry"):]
            entry = entry[: entry.index(")")]
            target = re.search(r"\\.target (\\w+)", kernel.ptx).group(1)
            vector_loads = len(re.findall(r"ld\\.global(\\.\\w+)*\\.v[24]", kernel.ptx))
            print(arch, kernel.name, target, entry.count(".param"), kernel.num_warps,
                  kernel.shared_mem, kernel.block_m, vector_loads)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.strip().splitlines()]
    assert [line[:3] for line in lines] == [
        ["80", "paged_attention_kernel", "sm_80"],
        ["90", "paged_attention_kernel", "sm_90a"],
    ]
    for line in lines:
        # 9 input pointers + 2 int32 scalars + 3 output pointers, then Triton's 2 hidden
        # scratch pointers (unused: compile_aot refuses kernels that need scratch memory).
        assert int(line[3]) == 16
        assert int(line[6]) == 2  # block_m: 16 rows / GROUP_PAD 8
        assert 0 < int(line[5]) <= 101376
        # Pointers compiled as 16-byte aligned: the tile loads are vectorized (without the
        # hint every load was scalar and the kernel ran 1.1-6.5x slower on an H200).
        assert int(line[7]) > 0
