"""The hybrid runner of CPU engines: each step on the kernels fastest for its size.

ONNX Runtime's ``MatMulNBits`` (the int4 and 8-bit weight-only kernel of quantized engines) is
the fastest kernel measured here for one row and loses about 2x to OpenVINO's runtime on the
same int4 weights from 16 rows up (Gemma 3 270M's 18 layers, AMD EPYC with AVX-512 VNNI:
2.80 ms against 3.43 at M=1, 18.28 against 8.86 at M=16, 90.87 against 54.26 at M=128;
``benchmarks/bench_cpu_gemm.py``, RESULTS.md "GEMM kernels per step shape"). So a step of
fewer than ``min_tokens`` new tokens runs as ``OrtRunner`` runs it (the single graph on the CPU
EP), and a larger one (prefill, chunks, batched decode) through the same engine's segments
compiled by OpenVINO's runtime (``openvino_runner.compile_segments``), the plugin's C kernel
between them. Both read and write the one set of numpy KV caches, so a sequence moves between
them from step to step. Both hold the weights: resident memory is the engine's bytes plus
OpenVINO's copy (``OPENVINO_LOAD_FACTOR``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmc.engine.provider import CPU_EP, ProviderChoice
from llmc.runtime.openvino_runner import PRECISIONS, compile_segments, openvino_available
from llmc.runtime.ort_runner import OrtRunner, step_feed
from llmc.runtime.step_inputs import StepInputs

#: New tokens from which a step runs on OpenVINO's runtime (``HybridRunner``).
MIN_OPENVINO_TOKENS = 8


class HybridRunner(OrtRunner):
    """Runs a CPU engine's small steps on ONNX Runtime and its large ones on OpenVINO's runtime,
    over one KV cache. Implements ``llmc.runtime.runner.Runner``.

    Args:
        engine_dir: the engine directory (``plan.json``, ``segments/``, ``engine.onnx``).
        num_blocks: KV blocks per layer (``OrtRunner``).
        threads: threads of each runtime (the attention kernel has its own pool).
        precision: OpenVINO's compute precision, "f32" or "bf16".
        min_tokens: steps of at least this many new tokens run on OpenVINO's runtime.

    Raises:
        RuntimeError: OpenVINO is not installed or lists no CPU device (the message says which),
            or a segment does not compile.
        ValueError: ``precision`` is not one of ``PRECISIONS``, or ``min_tokens`` < 1.
    """

    def __init__(
        self,
        engine_dir: str | Path,
        num_blocks: int,
        threads: int = 2,
        precision: str = "f32",
        min_tokens: int = MIN_OPENVINO_TOKENS,
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {min_tokens}")
        reason = openvino_available()
        if reason is not None:
            raise RuntimeError(f"cannot run {engine_dir} on OpenVINO: {reason}")
        super().__init__(engine_dir, num_blocks, threads, ProviderChoice(CPU_EP, "f32"))
        self.min_tokens = min_tokens
        self._large = compile_segments(Path(engine_dir), self.plan, threads, precision)

    def run_step(self, step: StepInputs) -> dict[str, np.ndarray]:
        """Run one step (``OrtRunner.run_step``) on the runtime its size picks."""
        if len(step.input_ids) < self.min_tokens:
            return super().run_step(step)
        return self._run_segments(step, step_feed(step), self._large)
