"""The OpenVINO runner of CPU engines: the engine's ONNX segments compiled by OpenVINO's own
runtime (the ``openvino`` package), the PagedAttention plugin's C kernel between them.

ONNX Runtime's OpenVINO execution provider refuses non-Intel CPUs (DESIGN §9), but OpenVINO's
runtime runs on any x86-64 CPU and reads ONNX: on AVX-512 BF16 and VNNI hosts its CPU plugin
has bf16 and int8 GEMMs that ONNX Runtime's CPU EP lacks. The segments are the same files the
ONNX Runtime runner falls back to (``llmc.engine.split``), so what is measured at build time
(``llmc.compiler.backends.onnxruntime.provider_choice``) is what ships; the KV cache, the plugin
calls and the step
loop are ``OrtRunner``'s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmc.engine.plan import load_plan
from llmc.runtime.runners.ort_runner import OrtRunner

#: Resident bytes per engine weight byte once OpenVINO has compiled the segments and run a
#: 128-token prefill: it holds its repacked weights beside the originals it read. Measured on
#: the Qwen2.5-0.5B-shaped float32 engine (1.98 GB): 4.54 GB peak at bf16 compute, 4.91 GB at
#: f32 (AMD EPYC, openvino 2026.4.1); ONNX Runtime's CPU EP holds the engine once.
OPENVINO_LOAD_FACTOR = 2.5
#: ``ProviderChoice.precision`` values, which are also OpenVINO's ``INFERENCE_PRECISION_HINT``.
PRECISIONS = ("f32", "bf16")


def openvino_available() -> str | None:
    """None when OpenVINO's runtime is installed and lists a CPU device, else the reason."""
    try:
        import openvino as ov
    except ImportError:
        return "the openvino package is not installed (pip install openvino)"
    if "CPU" not in ov.Core().available_devices:
        return "OpenVINO lists no CPU device on this host"
    return None


class _Segment:
    """One compiled segment, called like an ``onnxruntime.InferenceSession``: ``run(names,
    feed)`` returns the named outputs as numpy arrays the caller owns (copies: OpenVINO reuses
    its output buffers on the next inference)."""

    def __init__(self, compiled):
        self._request = compiled.create_infer_request()
        self._outputs = {o.get_any_name(): o for o in compiled.outputs}
        self._compiled = compiled

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self._request.infer(feed)
        return [np.array(self._request.get_tensor(self._outputs[n]).data) for n in names]

    def get_inputs(self) -> list:
        return [_Output(i) for i in self._compiled.inputs]

    def get_outputs(self) -> list:
        return [_Output(o) for o in self._compiled.outputs]


class _Output:
    """``onnxruntime.NodeArg``'s ``name`` and ``shape`` for an OpenVINO input or output port."""

    def __init__(self, port):
        shape = port.get_partial_shape()
        self.name = port.get_any_name()
        self.shape = [d.get_length() if d.is_static else None for d in shape]


class OpenVinoRunner(OrtRunner):
    """Runs a CPU engine's segments on OpenVINO's CPU plugin. Implements
    ``llmc.runtime.runners.runner.Runner``; the KV cache and plugin calls are ``OrtRunner``'s
    segment form.

    Args:
        engine_dir: the engine directory (``plan.json``, ``segments/``).
        num_blocks: KV blocks per layer (``OrtRunner``).
        threads: OpenVINO inference threads (the attention kernel has its own pool).
        precision: "f32" or "bf16" compute (``INFERENCE_PRECISION_HINT``; bf16 takes AVX-512
            BF16 or AMX, else OpenVINO computes in f32).

    Raises:
        RuntimeError: OpenVINO is not installed or lists no CPU device (the message says which).
        ValueError: ``precision`` is not one of ``PRECISIONS``.
    """

    def __init__(
        self, engine_dir: str | Path, num_blocks: int, threads: int = 2, precision: str = "f32"
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
        reason = openvino_available()
        if reason is not None:
            raise RuntimeError(f"cannot run {engine_dir} on OpenVINO: {reason}")
        engine_dir = Path(engine_dir)
        plan = load_plan(engine_dir)
        sessions = compile_segments(engine_dir, plan, threads, precision)
        self._setup(plan, sessions, num_blocks, single_graph=False)


def compile_segments(engine_dir: Path, plan, threads: int, precision: str) -> list[_Segment]:
    """The segments of ``plan`` (an ``ExecutionPlan`` of ``engine_dir``) compiled by OpenVINO's
    CPU plugin at ``precision`` ("f32" or "bf16") on ``threads`` threads, each called like an
    ONNX Runtime session. Needs ``openvino_available()``; OpenVINO raises RuntimeError for a
    segment it cannot compile."""
    import openvino as ov

    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": int(threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    return [
        _Segment(core.compile_model(str(engine_dir / s.file), "CPU", config)) for s in plan.segments
    ]
