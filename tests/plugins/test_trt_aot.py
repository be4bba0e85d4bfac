"""The AOT kernel TensorRT will launch: PTX pinned to an ISA every TensorRT 11 build's CUDA reads
and every target has, and tiles that fit the 48 KB of dynamic shared memory a launch gets
without opting in. Compiled here for real (Triton needs no GPU to write PTX), never run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from llmc.engine.plugin import PluginAttributes
from llmc.plugins.paged_attention import trt_aot

GEMMA = PluginAttributes(4, 1, 256, 0.0625, 512, 0.0, 16, 0, "auto", 1.0, 1.0)
LLAMA = PluginAttributes(32, 8, 128, 0.0884, 0, 0.0, 16, 0, "fp8", 0.02, 0.03)


def test_pinned_ptx_isa_is_one_every_target_has_and_tensorrt_cuda_reads():
    assert trt_aot.ptx_isa_of_cuda((12, 8)) == (8, 7)  # sm_120 arrived with CUDA 12.8
    assert trt_aot.ptx_isa_of_cuda((12, 9)) == (8, 8)
    assert trt_aot.ptx_isa_of_cuda((13, 3)) == (9, 3)  # TensorRT 11.1's CUDA
    assert trt_aot.ptx_isa_of_cuda((13, 4)) == (9, 4)  # triton 3.9's ptxas for sm90+: too new
    assert trt_aot.ptx_isa_ceiling() == (8, 8)
    assert all(trt_aot.PTX_ISA >= isa for isa in trt_aot.MIN_PTX_ISA.values())
    assert trt_aot.PTX_ISA <= trt_aot.ptx_isa_ceiling()
    assert trt_aot.ptx_isa_of("//\n.version 8.7\n.target sm_90a\n") == (8, 7)


def test_aot_shared_memory_limit_is_48_kb_and_the_opt_in_the_per_block_maximum():
    kb = 1024
    assert {a: trt_aot.shared_memory_limit(a) for a in trt_aot.MAX_SHARED_MEMORY} == dict.fromkeys(
        trt_aot.MAX_SHARED_MEMORY, 48 * kb
    )
    opted = {a: trt_aot.shared_memory_limit(a, opted_in=True) for a in trt_aot.MAX_SHARED_MEMORY}
    assert opted == {80: 163 * kb, 86: 99 * kb, 89: 99 * kb, 90: 227 * kb, 100: 227 * kb,
                     120: 99 * kb}  # fmt: skip
    # Gemma 3's head dim 256: 32 keys per tile fit in bfloat16, float32 needs 16
    assert trt_aot.aot_block_n(GEMMA, "bfloat16", 90) == 32
    assert trt_aot.aot_block_n(GEMMA, "float32", 90) == 16
    wide = PluginAttributes(4, 1, 512, 0.04, 0, 0.0, 16, 0, "auto", 1.0, 1.0)
    assert trt_aot.aot_block_n(wide, "float32", 90) is None


def test_aot_compile_writes_pinned_ptx_within_48_kb():
    pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.9.0)")
    script = textwrap.dedent("""
        import json, re
        from llmc.plugins.paged_attention import trt_aot, triton_tiles
        from llmc.engine.plugin import PluginAttributes
        gemma = PluginAttributes(4, 1, 256, 0.0625, 512, 0.0, 16, 0, "auto", 1.0, 1.0)
        llama = PluginAttributes(32, 8, 128, 0.0884, 0, 0.0, 16, 0, "fp8", 0.02, 0.03)
        out = []
        for name, a, dtype, arch in (("gemma", gemma, "bfloat16", 90),
                                     ("gemma", gemma, "float32", 90),
                                     ("llama", llama, "bfloat16", 120)):
            k = trt_aot.compile_aot(a, dtype, arch)
            block_n = trt_aot.aot_block_n(a, dtype, arch)
            config = triton_tiles.kernel_config(a.num_heads, a.num_kv_heads, a.head_dim,
                                                block_n=block_n)
            formula = triton_tiles.shared_memory_bytes(a.head_dim, dtype, config)
            version = re.search(r"\\.version (\\S+)", k.ptx).group(1)
            target = re.search(r"\\.target (\\w+)", k.ptx).group(1)
            out.append([name, dtype, arch, version, target, k.shared_mem, formula, block_n])
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r[:5] for r in rows] == [
        ["gemma", "bfloat16", 90, "8.7", "sm_90a"],
        ["gemma", "float32", 90, "8.7", "sm_90a"],
        ["llama", "bfloat16", 120, "8.7", "sm_120a"],
    ]
    assert [r[7] for r in rows] == [32, 16, 32]
    for *_, shared, formula, _ in rows:
        assert 0 < shared <= formula <= 48 * 1024  # the lint's formula bounds Triton's number


def test_the_launch_harness_counts_parameters_and_differing_cache_bytes():
    """ci/gpu_aot_launch.py's two pure helpers (the GPU part itself needs a GPU): the PTX entry's
    parameter count (the hidden trailing pointers it passes as null) and the cache comparison
    that names how many bytes differ and the first pair of codes."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "ci"))
    from gpu_aot_launch import cache_difference, entry_parameters

    ptx = ".visible .entry k(\n .param .u64 k_param_0,\n .param .u32 k_param_1\n)\n{\n}\n"
    assert entry_parameters(ptx, "k") == 2
    with pytest.raises(ValueError, match="no entry 'other'"):
        entry_parameters(ptx, "other")
    cache = torch.arange(64, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(2, 4, 8)
    assert cache_difference(cache, cache.clone()) == ""
    other = cache.clone()
    other.view(torch.uint8).view(-1)[37] = 0x80
    assert cache_difference(cache, other) == (
        "caches: 1 of 64 bytes differ, first at byte 37: 0x25 against the reference's 0x80"
    )


def test_the_fp8_cache_encoder_compiles_to_exact_integer_and_float_operations():
    """FP8 codes must equal the reference's bit for bit, and two things that the interpreter
    cannot see broke that on an H200: Triton compiles float32 `/` to ``div.full.f32``
    (approximate), which moved ties; and a float negation lost the sign of -0.0 (a negative value
    that rounds to zero came out 0x00 where the reference writes 0x80). So the FP8 kernel may hold
    no more approximate divisions than the plain-cache kernel (the softmax's, which the outputs'
    tolerance covers), and a ``neg.f32`` in it may only feed an ``fma`` (``x - floor(x)`` fused),
    never a value whose sign bit becomes a code's."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.9.0)")
    script = textwrap.dedent(r"""
        import re
        from llmc.engine.plugin import PluginAttributes
        from llmc.plugins.paged_attention import trt_aot
        for cache in ("auto", "fp8", "int8"):
            a = PluginAttributes(32, 8, 128, 0.0884, 0, 0.0, 16, 0, cache, 0.02, 0.03)
            ptx = trt_aot.compile_aot(a, "bfloat16", 90).ptx
            consumers = set()
            for reg in re.findall(r"neg\.f32\s+(%r\d+),", ptx):
                for line in re.findall(rf"^\s*(\S+)\s[^\n]*{reg}(?!\d)", ptx, re.M):
                    consumers.add(line)
            consumers.discard("neg.f32")
            print(cache, ptx.count("div.full.f32"), ",".join(sorted(consumers)) or "-")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.strip().splitlines()}
    divisions = {cache: int(row[0]) for cache, row in rows.items()}
    assert divisions["auto"] > 0  # the count is of the instruction Triton really emits
    assert divisions["fp8"] == divisions["int8"] == divisions["auto"]
    for cache, row in rows.items():
        assert set(row[1].split(",")) <= {"-", "fma.rn.f32"}, (cache, row[1])
