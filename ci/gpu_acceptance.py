"""GPU acceptance of the paged-attention plugin kernel and the TensorRT path, in one command.

    python ci/gpu_acceptance.py                            # NVIDIA GPU, torch (CUDA), triton
    python ci/gpu_acceptance.py --device cpu --interpret   # dry run: tiny shapes, Triton's
                                                           # CPU interpreter (no GPU needed)

Parts, each printed as a table:

1. Accuracy: the Triton kernel (``paged_attention_triton``: the main kernel, and flash-decoding
   for decode tokens) against the torch reference (``reference.py``, the ground truth, run on
   the same device) on real shapes: Llama-3-8B (32 heads, 8 KV heads, head dim 128) and
   Gemma 3 270M (4 heads, 1 KV head, head dim 256; its local layers' window of 512 and its
   global layers), prefill, chunked prefill, a mixed step, and decode at batch 1/16/64 with
   contexts 512/4096/32768 (a case whose tensors would not fit in free GPU memory is skipped
   and says so), in bfloat16 and float16. Max abs error against a tolerance per dtype; the
   caches the kernel writes must equal the reference's bit for bit.
2. Time: median of ``--repeat`` runs timed with CUDA events, the kernel against
   ``torch.nn.functional.scaled_dot_product_attention`` on the same data gathered dense from
   the cache (outside the timing; SDPA's own error against the reference is shown too).
3. Shared memory: Triton's count for each kernel, compiled for this GPU, against
   ``triton_tiles.shared_memory_bytes`` (the TensorRT lint's formula): it must not be lower
   (``gpu_shared_memory.py``).
4. The TensorRT AOT kernel (``trt_aot.compile_aot``'s PTX) loaded through the CUDA driver and
   launched with the grid, threads, shared memory and argument order TensorRT's AOT plugin path
   gives it (``gpu_aot_launch.py``), against the reference on the prefill, chunk, mixed and
   decode workloads, with a plain, an FP8 and an int8 KV cache; its time beside the torch
   launcher's.
5. TensorRT, where ``import tensorrt`` works: ``llmc build`` of tiny Llama and Gemma 3 engines
   for cpu and for this GPU's smXX, and their greedy generations compared (``gpu_tensorrt.py``).

Exit status: 0 when every part that ran passed (a part that cannot run here prints SKIP and
why); 1 on any failure (accuracy, caches, the formula, a build, the generations); 3 when there
is no CUDA GPU (nothing was accepted; ``--device cpu --interpret`` is the dry run); 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_workloads import (  # ci/ is on sys.path (this script's)
    REAL_SHAPES,
    TINY_SHAPES,
    TINY_WORKLOADS,
    Shape,
    Workload,
    kwargs_of,
    make_step,
    real_workloads,
    step_bytes,
)

REPO = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 3

#: (atol, rtol) of the kernel's output against the reference, by dtype: P is rounded to the
#: 16-bit dtype for ``P V`` (2^-9 relative in bfloat16, 2^-12 in float16) and the output once.
TOLERANCE = {"bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 4e-3)}


@dataclass(frozen=True)
class Row:
    """One line of the accuracy/time table."""

    shape: str
    dtype: str
    workload: str
    splits: int | str
    error: float | None
    ok: bool | None  # None: skipped
    kernel_ms: float | None = None
    sdpa_ms: float | None = None
    sdpa_error: float | None = None
    note: str = ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    p = argparse.ArgumentParser(
        description="GPU acceptance of the paged-attention kernel (accuracy against the "
        "reference, time against SDPA, shared memory) and of the TensorRT path.",
        epilog="exit status: 0 passed (skipped parts say SKIP), 1 a failure, 3 no CUDA GPU",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default), or cpu with --interpret for a dry run")  # fmt: skip
    p.add_argument("--interpret", action="store_true",
                   help="run the kernels in Triton's interpreter (TRITON_INTERPRET=1) on tiny "
                   "shapes; needs --device cpu")  # fmt: skip
    p.add_argument("--dtype", action="append", choices=tuple(TOLERANCE),
                   help="activation dtype (repeatable; default both)")  # fmt: skip
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed runs per case, median reported (default 20 on cuda, 1 on cpu)",
    )
    p.add_argument("--max-context", type=int, default=32768,
                   help="skip workloads with a longer context (default 32768)")  # fmt: skip
    p.add_argument("--num-splits", type=int, default=None,
                   help="flash-decoding slices (default: the launcher's heuristic on cuda, "
                   "3 with --interpret)")  # fmt: skip
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (16)")
    p.add_argument("--no-tensorrt", action="store_true", help="skip the TensorRT part")
    p.add_argument(
        "--no-aot", action="store_true", help="skip the AOT kernel's launch through the CUDA driver"
    )
    p.add_argument("--min-match", type=int, default=8,
                   help="TensorRT part: greedy tokens each prompt must share with the CPU "
                   "engine's (of 16; default 8: TF32 and fused kernels may flip a near-tie "
                   "later)")  # fmt: skip
    args = p.parse_args(argv)
    if args.device == "cpu" and not args.interpret:
        p.error("--device cpu runs the kernels only in Triton's interpreter: add --interpret")
    if args.interpret and args.device != "cpu":
        p.error("--interpret runs on the CPU: add --device cpu")
    return args


def time_ms(fn: Callable[[], object], repeat: int, cuda: bool) -> float:
    """Median milliseconds of ``repeat`` calls: CUDA events after one warm-up call on a GPU
    (the time includes the launcher's Python work), wall time in the interpreter."""
    import torch

    if cuda:
        fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def dense_sdpa(shape: Shape, workload: Workload, step: list, key_cache, value_cache):
    """SDPA on the step's data gathered dense from the (written) caches: one call per group of
    sequences with equal (context, new tokens). Returns (run, scatter): ``run()`` computes the
    groups' outputs, ``scatter(outputs)`` packs them as [T, H*D]."""
    import torch
    import torch.nn.functional as F

    q, query_start_loc, block_tables = step[0], step[6], step[7]
    h, kvh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    window = shape.sliding_window
    groups: dict[tuple[int, int], list[int]] = {}
    for b, seq in enumerate(workload.seqs):
        groups.setdefault(seq, []).append(b)
    calls = []
    for (context, num_new), members in groups.items():
        first = 0 if window is None or num_new > 1 else max(0, context - window)
        # Dense [B, heads, tokens, D], filled sequence by sequence (one gathered copy at a time).
        qd = q.new_empty((len(members), h, num_new, d))
        kd = q.new_empty((len(members), kvh, context - first, d))
        vd = torch.empty_like(kd)
        rows = []
        for i, b in enumerate(members):
            blocks = block_tables[b, : -(-context // key_cache.shape[1])].long()
            kd[i] = key_cache[blocks].reshape(-1, kvh, d)[first:context].transpose(0, 1)
            vd[i] = value_cache[blocks].reshape(-1, kvh, d)[first:context].transpose(0, 1)
            start = int(query_start_loc[b])
            qd[i] = q[start : start + num_new].view(num_new, h, d).transpose(0, 1)
            rows.append(torch.arange(start, start + num_new, device=q.device))
        positions = torch.arange(context - num_new, context, device=q.device)[:, None]
        key_pos = torch.arange(first, context, device=q.device)[None, :]
        mask = key_pos <= positions
        if window is not None:
            mask &= key_pos > positions - window
        causal = num_new == context and window is None
        calls.append((qd, kd, vd, None if causal or num_new == 1 else mask, causal, rows))
    try:
        F.scaled_dot_product_attention(*calls[0][:3], scale=1.0, enable_gqa=True)
        gqa = True
    except (TypeError, RuntimeError):  # torch < 2.5: expand the KV heads (outside the timing)
        gqa = False
        calls = [(qd, kd.repeat_interleave(h // kvh, 1), vd.repeat_interleave(h // kvh, 1), m,
                  c, r) for qd, kd, vd, m, c, r in calls]  # fmt: skip
    extra = {"enable_gqa": True} if gqa else {}

    def run() -> list:
        return [F.scaled_dot_product_attention(qd, kd, vd, attn_mask=m, is_causal=c,
                                               scale=d**-0.5, **extra)
                for qd, kd, vd, m, c, _ in calls]  # fmt: skip

    def scatter(outputs: list):
        out = torch.zeros_like(q)
        for (*_, rows), o in zip(calls, outputs, strict=True):
            out[torch.cat(rows)] = o.transpose(1, 2).reshape(-1, h * d)
        return out

    return run, scatter


def accuracy_and_time(args, shape: Shape, workload: Workload, dtype_name: str) -> Row:
    """One row: the kernel's max abs error against the reference, its time and SDPA's (ms, CUDA
    events, median of ``args.repeat``) on the same data."""
    import torch

    from llmc.plugins.paged_attention.reference import paged_attention_reference
    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton
    from llmc.plugins.paged_attention.triton_tiles import choose_num_splits

    dtype, device = getattr(torch, dtype_name), torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        need = step_bytes(shape, workload, args.block_size, dtype.itemsize)
        free = torch.cuda.mem_get_info()[0]
        if need > 0.8 * free:
            return Row(
                shape.name,
                dtype_name,
                workload.name,
                "-",
                None,
                None,
                note=f"SKIP: needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} free",
            )
    step = make_step(shape, workload, dtype, device, args.block_size, seed=len(workload.seqs))
    reference_step = [t.clone() for t in step]
    splits = args.num_splits
    if splits is None:
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
        max_context = step[7].shape[1] * args.block_size
        splits = choose_num_splits(len(workload.seqs), shape.num_kv_heads, max_context, num_sms)
    kwargs = kwargs_of(shape)

    out = paged_attention_triton(*step, **kwargs, num_splits=splits)
    with device:  # the reference makes its tensors on the default device
        expected = paged_attention_reference(*reference_step, **kwargs)
    error = (out.float() - expected.float()).abs()
    atol, rtol = TOLERANCE[dtype_name]
    ok = bool((error <= atol + rtol * expected.float().abs()).all())
    note = ""
    caches = ((step[3], reference_step[3]), (step[4], reference_step[4]))
    if not all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in caches):
        ok, note = False, "FAIL: caches differ from the reference's"

    repeat = args.repeat or (20 if cuda else 1)
    kernel_ms = time_ms(lambda: paged_attention_triton(*step, **kwargs, num_splits=splits,
                                                       out=out), repeat, cuda)  # fmt: skip
    sdpa_ms = sdpa_error = None
    if shape.logit_softcap is None:  # SDPA has no soft-cap
        run, scatter = dense_sdpa(shape, workload, step, step[3], step[4])
        sdpa_out = scatter(run())
        sdpa_error = (sdpa_out.float() - expected.float()).abs().max().item()
        sdpa_ms = time_ms(run, repeat, cuda)
    return Row(shape.name, dtype_name, workload.name, splits, error.max().item(), ok,
               kernel_ms, sdpa_ms, sdpa_error, note)  # fmt: skip


def print_header(cuda: bool) -> None:
    """Print the accuracy/time table's header (rows follow as each case finishes)."""
    unit = "ms; speedup = SDPA / kernel" if cuda else "ms: interpreter, not a measurement"
    print(f"\n{'shape':<20}{'dtype':<10}{'workload':<23}{'splits':>6}{'max err':>10}{'':>6}"
          f"{'kernel':>10}{'SDPA':>10}{'speedup':>10}{'SDPA err':>10}   [{unit}]")  # fmt: skip


def print_row(r: Row) -> None:
    """Print one accuracy/time row, flushed (a run stopped at its limit keeps what it printed)."""
    if r.ok is None:
        print(f"{r.shape:<20}{r.dtype:<10}{r.workload:<23}  {r.note}", flush=True)
        return
    verdict = " ok " if r.ok else " FAIL"
    speed = f"{r.sdpa_ms / r.kernel_ms:>10.2f}" if r.sdpa_ms else f"{'-':>10}"
    sdpa = f"{r.sdpa_ms:>10.3f}" if r.sdpa_ms is not None else f"{'-':>10}"
    sdpa_err = f"{r.sdpa_error:>10.2e}" if r.sdpa_error is not None else f"{'-':>10}"
    line = (f"{r.shape:<20}{r.dtype:<10}{r.workload:<23}{r.splits:>6}{r.error:>10.2e}"
            f"{verdict:<6}{r.kernel_ms:>10.3f}{sdpa}{speed}{sdpa_err}  {r.note}")  # fmt: skip
    print(line, flush=True)


#: Workloads the AOT kernel is checked on (it has no split decode: one launch per step).
AOT_WORKLOADS = ("prefill 1x4096", "chunk 512 of 4096", "mixed 15x4096 dec+512",
                 "decode 16x4096", "decode 16x32768")  # fmt: skip


def aot_launch_part(args, shapes, workloads, dtypes: list[str], arch: int) -> bool:
    """Part 4 (``gpu_aot_launch.aot_part``); SKIP (True) when CuPy is missing."""
    try:
        import cupy  # noqa: F401
    except ImportError as error:
        print(f"\nSKIP AOT kernel: CuPy loads the PTX through the CUDA driver ({error})")
        return True
    from gpu_aot_launch import aot_part  # ci/ is on sys.path (this script's)

    chosen = [w for w in workloads if w.name in AOT_WORKLOADS]
    return aot_part(shapes, chosen, dtypes, arch, make_step=make_step, kwargs_of=kwargs_of,
                    time_ms=time_ms, tolerance=TOLERANCE, block_size=args.block_size,
                    repeat=args.repeat or 20, caches=("auto", "fp8", "int8"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the acceptance; exit 0 passed, 1 a failure, 2 bad arguments, 3 no CUDA GPU."""
    args = parse_args(argv)
    if args.interpret:
        # Before the kernel modules are first imported: @triton.jit reads it there.
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(REPO))
    import torch
    import triton

    dtypes = args.dtype or list(TOLERANCE)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("SKIP everything: no CUDA GPU visible to torch (torch.cuda.is_available() is "
                  "False); nothing was accepted. Dry run: --device cpu --interpret")  # fmt: skip
            return EXIT_NO_GPU
        major, minor = torch.cuda.get_device_capability()
        arch = 10 * major + minor
        props = torch.cuda.get_device_properties(0)
        print(f"device: {torch.cuda.get_device_name()} (sm{arch}, {props.multi_processor_count} "
              f"SMs, {props.total_memory / 2**30:.0f} GiB)")  # fmt: skip
        shapes, workloads = REAL_SHAPES, real_workloads(args.max_context)
    else:
        arch = None
        print("device: cpu (Triton interpreter, tiny shapes: a dry run of this script)")
        shapes, workloads = TINY_SHAPES, list(TINY_WORKLOADS)
        if args.num_splits is None:
            args.num_splits = 3
    print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")

    print_header(args.device == "cuda")
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for workload in workloads:
                rows.append(accuracy_and_time(args, shape, workload, dtype))
                print_row(rows[-1])
    ok = all(r.ok is not False for r in rows)
    if arch is not None:
        from gpu_shared_memory import shared_memory_part  # ci/ is on sys.path (this script's)

        ok &= shared_memory_part(shapes, dtypes, arch)
        if args.no_aot:
            print("\nSKIP AOT kernel: --no-aot")
        else:
            ok &= aot_launch_part(args, shapes, workloads, dtypes, arch)
    else:
        print("\nSKIP shared memory: the interpreter compiles nothing (run without --interpret)")
    if args.no_tensorrt:
        print("\nSKIP tensorrt: --no-tensorrt")
    elif args.device == "cpu":
        print("\nSKIP tensorrt: --device cpu (TensorRT needs an NVIDIA GPU)")
    else:
        from gpu_tensorrt import tensorrt_part  # ci/ is on sys.path (this script's)

        ok &= tensorrt_part(arch, args.min_match) is not False
    print(f"\n{'PASSED' if ok else 'FAILED'}")
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
