"""The ``IPluginV3`` PagedAttention plugin's ``enqueue`` on a GPU, called directly with device
buffers, against the torch reference, and its time beside the torch launcher's.

    python ci/gpu_v3_enqueue.py     # NVIDIA GPU, torch (CUDA), triton

TensorRT is not needed: ``trt_v3._enqueue`` (the whole body of ``enqueue``) reads only the
descriptors' ``type`` and ``dims`` and the buffers' device pointers, so it is handed stand-ins
for TensorRT's ``DataType`` and ``PluginTensorDesc`` and the pointers of torch tensors, on the
current stream, exactly as TensorRT would call it. The acceptance shapes and workloads are
``gpu_acceptance.py``'s (bfloat16). Exit status 0 when every case is within tolerance with its
caches equal to the reference's, 1 otherwise, 3 without a CUDA GPU.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from gpu_workloads import REAL_SHAPES, kwargs_of, make_step, real_workloads, step_bytes

BLOCK_SIZE = 16
ATOL = RTOL = 1.6e-2  # bfloat16, as gpu_acceptance.py


def stand_in_trt():
    """A stand-in for the ``trt`` module: ``DataType`` members as torch dtypes' names."""
    names = ("FLOAT", "HALF", "BF16", "FP8", "INT8", "INT32", "INT64")
    return SimpleNamespace(DataType=SimpleNamespace(**{n: n for n in names}))


def desc_of(tensor) -> SimpleNamespace:
    """A ``PluginTensorDesc`` stand-in for ``tensor``."""
    import torch

    kinds = {torch.bfloat16: "BF16", torch.float16: "HALF", torch.float32: "FLOAT",
             torch.int32: "INT32", torch.int64: "INT64", torch.int8: "INT8",
             torch.float8_e4m3fn: "FP8"}  # fmt: skip
    return SimpleNamespace(type=kinds[tensor.dtype], dims=tuple(tensor.shape))


def time_ms(fn, repeat: int = 20) -> float:
    """Median of ``repeat`` CUDA-event timings of ``fn()`` after one warm-up call, ms."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> int:
    """Every acceptance case: error, cache equality, enqueue and launcher times; the exit
    status (module docstring)."""
    import torch

    from llmc.engine.plugin import PluginAttributes
    from llmc.plugins.paged_attention.reference import paged_attention_reference
    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton
    from llmc.plugins.paged_attention.trt_v3 import _enqueue

    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 3
    trt, device, failures = stand_in_trt(), torch.device("cuda"), 0
    print("shape | workload | max abs error | ok | enqueue ms | launcher ms")
    for shape in REAL_SHAPES:
        for workload in real_workloads(32768):
            need = step_bytes(shape, workload, BLOCK_SIZE, 2)
            if need > 0.8 * torch.cuda.mem_get_info()[0]:
                print(f"{shape.name} | {workload.name} | SKIP: {need / 2**30:.1f} GiB")
                continue
            step = make_step(shape, workload, torch.bfloat16, device, BLOCK_SIZE, seed=7)
            reference_step = [t.clone() for t in step]
            kwargs = kwargs_of(shape)
            attributes = PluginAttributes(
                **{k: v or 0 for k, v in kwargs.items()}, block_size=BLOCK_SIZE, layer_idx=0
            )
            out = torch.empty_like(step[0])
            outputs = [out, step[3], step[4]]  # the caches aliased, as TensorRT binds them
            stream = torch.cuda.current_stream().cuda_stream

            def enqueue(step=step, outputs=outputs, attributes=attributes, stream=stream):
                _enqueue(trt, attributes, [desc_of(t) for t in step],
                         [desc_of(t) for t in outputs], [t.data_ptr() for t in step],
                         [t.data_ptr() for t in outputs], stream)  # fmt: skip

            enqueue()
            torch.cuda.synchronize()
            with device:
                expected = paged_attention_reference(*reference_step, **kwargs)
            error = (out.float() - expected.float()).abs()
            ok = bool((error <= ATOL + RTOL * expected.float().abs()).all())
            ok &= all(torch.equal(step[i], reference_step[i]) for i in (3, 4))
            failures += not ok
            enqueue_ms = time_ms(enqueue)
            launcher_ms = time_ms(lambda step=step, k=kwargs: paged_attention_triton(*step, **k))
            print(f"{shape.name} | {workload.name} | {error.max().item():.3g} | {ok} | "
                  f"{enqueue_ms:.3f} | {launcher_ms:.3f}")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
