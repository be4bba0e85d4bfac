"""Flash-decoding (the decode tokens' context split across programs, then reduced) under
TRITON_INTERPRET=1 against the torch reference; the split heuristic; the kernels' shared memory
against Triton's own count; the GPU acceptance script's dry run."""

from __future__ import annotations

import os

# Before the first import of the kernel modules in this process: @triton.jit reads it there.
os.environ["TRITON_INTERPRET"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.9.0)")

from llmc.plugins.paged_attention.reference import paged_attention_reference  # noqa: E402
from llmc.plugins.paged_attention.triton_launch import paged_attention_triton  # noqa: E402
from llmc.plugins.paged_attention.triton_tiles import (  # noqa: E402
    choose_block_m,
    choose_num_splits,
    kernel_config,
    shared_memory_bytes,
)
from tests.plugins.test_paged_attention import Case  # noqa: E402
from tests.plugins.test_triton_paged_attention import (  # noqa: E402
    DTYPES,
    TOLERANCE,
    as_bytes,
    kwargs_of,
    step_tensors,
)

REPO = Path(__file__).resolve().parents[2]

# (case, num_splits, block_n). Head dims 16/32 and few heads keep the interpreter fast; contexts
# of 40-160 keys give several slices of 16-64 keys each.
CASES = {
    # Prefill, chunked prefill and decode in one step; 9 and 12 keys are shorter than one slice
    # (the other slices of those tokens see nothing); 130 keys in 3 slices of 48: boundaries at
    # 48 and 96, inside the 32-key cache blocks.
    "ragged-mqa": (Case(((130, 1), (40, 40), (9, 1), (75, 11), (12, 1), (64, 1)), 4, 1, 16, 32),
                   3, 16),
    "gqa4-two-kv-heads": (Case(((100, 1), (33, 1), (50, 7), (161, 1)), 8, 2, 32, 16), 4, 16),
    "mqa-group8": (Case(((90, 1), (17, 1), (24, 24)), 8, 1, 16, 8), 5, 16),
    "mha": (Case(((70, 1), (20, 4)), 2, 2, 16, 16), 2, 32),
    "group32-rows32": (Case(((80, 1), (5, 1)), 32, 1, 16, 16), 3, 16),
    # Slices of 16 keys from the window's first key (position 150 - 37 + 1 = 114): slice
    # boundaries at 130 and 146, neither on a 24-key block boundary; a shorter context too.
    "window-across-slices": (Case(((150, 1), (30, 1), (60, 20)), 4, 1, 16, 24,
                                  sliding_window=37), 3, 16),
    "window-block-size-64": (Case(((140, 1), (70, 1)), 4, 2, 16, 64, sliding_window=50), 4, 16),
    "softcap": (Case(((120, 1), (45, 1), (30, 10)), 4, 1, 32, 16, logit_softcap=5.0), 3, 32),
    "softcap-window": (Case(((110, 1), (66, 1)), 8, 2, 16, 16, sliding_window=40,
                            logit_softcap=20.0), 2, 16),
    # More slices than 16-key tiles: most slices of every token are empty.
    "more-slices-than-tiles": (Case(((40, 1), (3, 1), (18, 1)), 4, 1, 16, 16), 8, 16),
    "decode-only-block-size-1": (Case(((45, 1), (31, 1)), 2, 1, 16, 1), 3, 16),
}  # fmt: skip


def _params() -> list:
    """Each case in two of the three activation dtypes (each dtype 7 or 8 times); two cases
    again with a quantized (fp8, int8) cache."""
    dtypes = list(DTYPES)
    params = []
    for i, (name, (case, splits, block_n)) in enumerate(CASES.items()):
        for dtype in (dtypes[i % 3], dtypes[(i + 1) % 3]):
            params.append(pytest.param(case, dtype, "auto", splits, block_n, id=f"{name}-{dtype}"))
    for name, dtype, kv in (("ragged-mqa", "bfloat16", "fp8"), ("softcap", "float16", "int8")):
        case, splits, block_n = CASES[name]
        params.append(pytest.param(case, dtype, kv, splits, block_n, id=f"{name}-{dtype}-{kv}"))
    return params


@pytest.mark.parametrize(("case", "dtype", "kv", "num_splits", "block_n"), _params())
def test_split_decode_matches_reference(
    case: Case, dtype: str, kv: str, num_splits: int, block_n: int
) -> None:
    inputs = step_tensors(case, 11 * len(case.seqs) + case.head_dim, DTYPES[dtype], kv)
    expected_inputs = [t.clone() for t in inputs]
    # NaN where nothing writes: every row must come from the main kernel or the reduce.
    out = torch.full_like(inputs[0], float("nan"))

    paged_attention_triton(*inputs, **kwargs_of(case, kv), block_n=block_n,
                           num_splits=num_splits, out=out)  # fmt: skip
    expected = paged_attention_reference(*expected_inputs, **kwargs_of(case, kv))

    error = (out.float() - expected.float()).abs()
    atol, rtol = TOLERANCE[dtype]
    assert (error <= atol + rtol * expected.float().abs()).all(), f"max abs error {error.max()}"
    print(f"\nmax-abs-error {dtype} {kv} splits={num_splits}: {error.max().item():.3g}")
    assert torch.equal(as_bytes(inputs[3]), as_bytes(expected_inputs[3]))
    assert torch.equal(as_bytes(inputs[4]), as_bytes(expected_inputs[4]))


def test_split_and_unsplit_decode_agree() -> None:
    """The same step with 1 and 4 slices: float32, so the two differ by rounding only."""
    case = Case(((150, 1), (64, 1), (20, 5)), 4, 1, 16, 16, sliding_window=100)
    outs = []
    for num_splits in (1, 4):
        inputs = step_tensors(case, 3, torch.float32, "auto")
        outs.append(paged_attention_triton(*inputs, **kwargs_of(case, "auto"), block_n=16,
                                           num_splits=num_splits))  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], atol=2e-6, rtol=2e-6)


def test_num_splits_must_be_positive() -> None:
    case = CASES["mha"][0]
    inputs = step_tensors(case, 0, torch.float32, "auto")
    with pytest.raises(ValueError, match="num_splits must be at least 1, got 0"):
        paged_attention_triton(*inputs, **kwargs_of(case, "auto"), num_splits=0)


def test_launch_options_are_validated_and_carried() -> None:
    config = kernel_config(32, 8, 128, num_warps=8, num_stages=3)
    assert (config.num_warps, config.num_stages) == (8, 3)
    assert (kernel_config(32, 8, 128).num_warps, kernel_config(32, 8, 128).num_stages) == (4, 1)
    with pytest.raises(ValueError, match="num_warps must be a power of two, got 6"):
        kernel_config(32, 8, 128, num_warps=6)
    with pytest.raises(ValueError, match="num_stages must be at least 1, got 0"):
        kernel_config(32, 8, 128, num_stages=0)
    case = CASES["mha"][0]
    inputs = step_tensors(case, 0, torch.float32, "auto")
    with pytest.raises(ValueError, match="num_warps"):
        paged_attention_triton(*inputs, **kwargs_of(case, "auto"), num_warps=3)


def test_choose_num_splits() -> None:
    # The smallest power of two reaching 4 programs per SM (528 on 132 SMs): Llama-3-8B
    # (8 KV heads) at batch 16 has 128 programs -> 8 splits; batch 64 (512) -> 2.
    assert choose_num_splits(16, 8, 32768, 132) == 8
    assert choose_num_splits(64, 8, 4096, 132) == 2
    assert choose_num_splits(66, 8, 32768, 132) == 1
    # Gemma 3 (1 KV head): batch 64 at 4096 keys wants 9 -> 16, which 256-key slices allow.
    assert choose_num_splits(64, 1, 4096, 132) == 16
    # Bounded by MAX_SPLITS (64) and by 256 keys a slice, as a power of two (3000 // 256 = 11).
    assert choose_num_splits(1, 1, 32768, 132) == 64
    assert choose_num_splits(1, 8, 3000, 132) == 8
    assert choose_num_splits(1, 8, 512, 132) == 2
    assert choose_num_splits(1, 8, 255, 132) == 1


def test_choose_block_m_widens_the_tile_for_prefill_heavy_steps() -> None:
    # GQA 4 (Llama-3-8B, Gemma 3): 16 tokens x 4 heads = 64 rows once a step averages 16 new
    # tokens per sequence; decode and decode-heavy steps keep the default (None).
    assert choose_block_m(4096, 1, 4) == 16
    assert choose_block_m(512 + 15, 16, 4) == 16
    assert choose_block_m(64, 64, 4) is None
    assert choose_block_m(15, 1, 4) is None
    assert choose_block_m(64, 1, 1) == 64  # MHA: 64 tokens
    assert choose_block_m(200, 1, 64) == 1  # a group wider than 64 rows: one token


def test_the_launcher_default_tile_matches_the_reference_on_a_prefill_step() -> None:
    case = Case(((40, 40), (36, 36)), 8, 2, 16, 16)  # 38 new tokens per sequence: 64 rows
    dtype = DTYPES["float32"]
    step = step_tensors(case, 3, dtype, "auto")
    expected = paged_attention_reference(*[t.clone() for t in step], **kwargs_of(case, "auto"))
    out = paged_attention_triton(*step, **kwargs_of(case, "auto"))
    torch.testing.assert_close(out, expected, atol=TOLERANCE["float32"][0], rtol=1e-5)


def test_shared_memory_bytes_of_the_gemma3_and_llama_tiles() -> None:
    """The formula's values (its docstring): Gemma 3 (D 256, 4 heads on 1 KV head) fits the 48 KB
    a launch gets without opting in, in 16-bit at the default 32-key tiles."""
    gemma, llama = kernel_config(4, 1, 256), kernel_config(32, 8, 128)
    assert shared_memory_bytes(256, torch.bfloat16, gemma) == 2 * (16 * 256 + 32 * 256 + 16 * 32)
    assert shared_memory_bytes(256, "float16", gemma) == 25600 <= 48 * 1024
    assert shared_memory_bytes(128, torch.bfloat16, llama) == 13312
    assert shared_memory_bytes(256, torch.float32, gemma) > 48 * 1024  # float32 needs opt-in
    with pytest.raises(ValueError, match="head_dim"):
        shared_memory_bytes(300, torch.float16, gemma)


def test_shared_memory_bytes_bounds_what_triton_allocates() -> None:
    """Compile the kernels for sm90 and sm80 (no GPU needed; a process without
    TRITON_INTERPRET) and compare Triton's ``metadata.shared`` with the formula."""
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, "ci")
        import torch
        from gpu_shared_memory import compiled_shared_memory
        from llmc.plugins.paged_attention.triton_tiles import kernel_config, shared_memory_bytes
        for heads, kv_heads, head_dim, dtype, arch in ((4, 1, 256, "bfloat16", 90),
                                                       (32, 8, 128, "float16", 80)):
            config = kernel_config(heads, kv_heads, head_dim)
            measured = compiled_shared_memory(heads, kv_heads, head_dim, dtype, arch, config)
            print(shared_memory_bytes(head_dim, dtype, config), *measured)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for line in result.stdout.strip().splitlines():
        formula, *measured = (int(x) for x in line.split())
        assert max(measured) <= formula, line
        assert formula == measured[0], line  # exact for the main kernel


def test_gpu_acceptance_dry_run_in_the_interpreter() -> None:
    """ci/gpu_acceptance.py end to end on tiny shapes in Triton's interpreter: the accuracy
    table (prefill, decode, split decode), the SDPA timing code path, TensorRT skipped."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "ci/gpu_acceptance.py", "--device", "cpu", "--interpret", "--dtype",
         "bfloat16"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "device: cpu (Triton interpreter" in out
    assert "FAIL" not in out and out.count(" ok ") >= 8
    assert "splits" in out and "SKIP tensorrt" in out


def test_gpu_acceptance_help_and_exit_code_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the script would run for real")
    script = [sys.executable, "ci/gpu_acceptance.py"]
    shown = subprocess.run([*script, "--help"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0 and "--interpret" in shown.stdout
    skipped = subprocess.run(script, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 3 and "no CUDA GPU" in skipped.stdout
    wrong = subprocess.run([*script, "--device", "cpu"], cwd=REPO, capture_output=True, text=True)
    assert wrong.returncode == 2 and "add --interpret" in wrong.stderr
