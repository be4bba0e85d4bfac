"""The TensorRT runner of GPU engines, TensorRT 11's and TensorRT for RTX's (DESIGN §6-7).
NEVER RUN: no machine of ours has a GPU either targets (TensorRT for RTX: sm86, sm89, sm120).

Only the host check (``llmc.engine.host.check_gpu_host``, run before anything is deserialized
or ``tensorrt`` is imported) is tested here; ``TrtRunner`` is written against TensorRT's
documented Python API (``trt.Runtime.deserialize_cuda_engine``, ``ICudaEngine.num_io_tensors`` /
``get_tensor_name`` / ``get_tensor_mode`` / ``get_tensor_dtype``,
``IExecutionContext.set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3(stream)``)
and has never executed.

It implements ``llmc.runtime.runners.runner.Runner`` like ``OrtRunner``: one packed ``StepInputs``
in,
logits [S, vocab] float32 (numpy, on the host) out, so the scheduler, sampler and server are
unchanged. Buffers are torch CUDA tensors; the KV caches are allocated once per layer
([num_blocks, block_size, KVH, D] in the engine's cache dtype) and bound at construction; the
paged-attention plugin writes new keys and values into them in place. Each cache input has an
aliased engine output, ``trt_plugin.aliased_output_name(input)``, bound by that name to the same
memory, as NVIDIA's in-place plugin sample binds its aliased output (``qdp_runner.py``,
``run_inplace_add``). ``ICudaEngine.get_aliased_input_tensor`` is not used: it reports the
aliasing of TensorRT's own KV-cache layer, not a plugin's.

Plans load only on the TensorRT version that built them (``IRuntime::deserializeCudaEngine``
checks the version tag), so the host check compares major.minor.patch exactly, and the CUDA
device is made current before deserializing (TensorRT deserializes onto the current device).
AOT plugins leak CUDA modules when shapes change on TensorRT 11.1 to 11.2.1
(NVIDIA/TensorRT#4849, open): a warning says so when such a version runs the engine.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from llmc.engine.gpu import detect_gpus
from llmc.engine.gpu import tensorrt_version as installed_tensorrt_version
from llmc.engine.graph import STEP_INPUTS
from llmc.engine.host import check_gpu_host, check_tensorrt_version, release
from llmc.engine.kv_cache import kv_cache_dtype_of
from llmc.engine.manifest import EngineManifest
from llmc.engine.targets.sm import BACKEND, RTX_BACKEND
from llmc.engine.tensorrt_rtx import runtime_version as installed_rtx_version
from llmc.errors import EngineCorruptError, EngineError
from llmc.plugins.paged_attention.trt_plugin import aliased_output_name
from llmc.plugins.paged_attention.trt_register import register
from llmc.runtime.runners.step_inputs import StepInputs

log = logging.getLogger(__name__)


def _installed_version(manifest: EngineManifest) -> str | None:
    """The installed release of the engine's builder (TensorRT, or TensorRT for RTX with its
    libraries), None when absent; checked without importing it."""
    if manifest.backend == RTX_BACKEND:
        return installed_rtx_version()
    return installed_tensorrt_version()


def _tensorrt(manifest: EngineManifest):
    """(the TensorRT module of the engine's builder, the plugin registration to keep alive):
    ``tensorrt`` with the QDP plugin, or ``tensorrt_rtx_bindings`` (its libraries loaded by
    importing their package first) with the ``IPluginV3`` creator."""
    if manifest.backend == RTX_BACKEND:
        import onnxruntime_ep_nv_tensorrt_rtx  # noqa: F401  (loads the libraries)
        import tensorrt_rtx_bindings as trt

        from llmc.plugins.paged_attention import trt_v3

        return trt, trt_v3.register(trt)
    import tensorrt as trt

    register()
    return trt, None


#: TensorRT releases whose AOT plugins leak a CUDA module per shape change (NVIDIA/TensorRT#4849).
_AOT_LEAK_VERSIONS = ((11, 1, 0), (11, 2, 1))


class TrtRunner:
    """Runs a TensorRT engine directory on one GPU. Implements
    ``llmc.runtime.runners.runner.Runner``.

    Args:
        engine_dir: the engine directory (``manifest.json``, ``engine.plan``).
        manifest: its ``EngineManifest`` (already read; checked here first).
        num_blocks: KV blocks per layer; at most the optimization profile's maximum.

    Raises EngineMismatchError (see ``check_gpu_host``), EngineError (``num_blocks`` outside the
    profile), EngineCorruptError (TensorRT cannot deserialize the plan).
    """

    def __init__(self, engine_dir: str | Path, manifest: EngineManifest, num_blocks: int):
        # Before anything is deserialized or imported.
        gpu = check_gpu_host(manifest, detect_gpus(), _installed_version(manifest))
        import torch

        trt, self._creator = _tensorrt(manifest)

        engine_dir = Path(engine_dir)
        record = manifest.tensorrt or {}
        profile = (record.get("profiles") or [{}])[0]
        cache_max = profile.get("key_cache.0", {}).get("max", [math.inf])[0]
        if num_blocks > cache_max:
            raise EngineError(
                f"{num_blocks} KV blocks exceed the engine's optimization profile ({cache_max}); "
                "lower --kv-cache-memory / --num-blocks, or rebuild with larger limits"
            )
        check_tensorrt_version(manifest.backend_version, trt.__version__)  # the module itself
        first, last = _AOT_LEAK_VERSIONS
        leaky = first <= tuple(int(x) for x in release(trt.__version__)) <= last
        if manifest.backend == BACKEND and leaky:
            log.warning(
                "TensorRT %s leaks a CUDA module per input-shape change of an AOT plugin "
                "(NVIDIA/TensorRT#4849): GPU memory grows while serving; use another release",
                trt.__version__,
            )
        self.device = torch.device("cuda", gpu.index)
        torch.cuda.set_device(self.device)  # TensorRT deserializes onto the current device
        self._logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(self._logger)
        plan = (engine_dir / record.get("plan", "engine.plan")).read_bytes()
        self.engine = runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise EngineCorruptError(f"TensorRT could not deserialize {engine_dir}; rebuild it")
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream(self.device)
        self.num_blocks = num_blocks
        self.block_size = manifest.block_size
        self.vocab_size = manifest.vocab_size
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        # step inputs are integer tensors (numpy has no bfloat16: caches and logits are torch)
        self._np_types = {
            n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in STEP_INPUTS
        }
        # The dtype the pool was sized for (numpy and torch share the names).
        cache_dtype = getattr(torch, kv_cache_dtype_of(manifest).name)
        shape = (num_blocks, manifest.block_size, manifest.num_kv_heads, manifest.head_dim)
        self.kv_caches = {
            n: torch.zeros(shape, dtype=cache_dtype, device=self.device)
            for n in names
            if is_input[n] and n.startswith(("key_cache.", "value_cache."))
        }
        for n, cache in self.kv_caches.items():
            alias = aliased_output_name(n)
            if is_input.get(alias, True):
                raise EngineCorruptError(
                    f"{engine_dir} has no output {alias!r} aliasing cache {n!r}: the plugin's "
                    "cache writes would be lost; rebuild the engine with this llmc"
                )
            self.context.set_input_shape(n, tuple(cache.shape))
            self.context.set_tensor_address(n, cache.data_ptr())
            self.context.set_tensor_address(alias, cache.data_ptr())

    def execute(self, step: StepInputs) -> np.ndarray:
        """Run one step; returns logits [len(step.logits_indices), vocab] float32."""
        import torch

        with torch.cuda.stream(self.stream):
            feeds = {}
            for name in STEP_INPUTS:
                host = np.ascontiguousarray(getattr(step, name), dtype=self._np_types[name])
                feeds[name] = torch.from_numpy(host).to(self.device, non_blocking=True)
                self.context.set_input_shape(name, tuple(host.shape))
                self.context.set_tensor_address(name, feeds[name].data_ptr())
            rows = int(step.logits_indices.shape[0])
            logits = torch.empty((rows, self.vocab_size), dtype=torch.float32, device=self.device)
            self.context.set_tensor_address("logits", logits.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed; see the TensorRT log")
            out = logits.to("cpu")
        self.stream.synchronize()
        return out.numpy()
