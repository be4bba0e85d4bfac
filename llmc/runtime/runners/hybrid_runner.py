"""The hybrid runner of CPU engines: small steps on ONNX Runtime, large ones on OpenVINO.

On bare MatMuls of Gemma 3 270M's 18 layers (AMD EPYC with AVX-512 VNNI,
``benchmarks/bench_cpu_gemm.py``) OpenVINO's int4 kernels lead ONNX Runtime's ``MatMulNBits``
from a few rows up (M=8: 5.50 ms against 7.16; M=16: 8.83 against 11.74) and tie at one row.
So a step of fewer than ``min_tokens`` new tokens runs as ``OrtRunner`` runs it (the single
graph on the CPU EP, no per-segment overhead), and a larger one (prefill, chunks, batched
decode) through the same engine's segments compiled by OpenVINO's runtime
(``openvino_runner.compile_segments``), the plugin's C kernel between them. Both read and write
the one set of numpy KV caches, so a sequence moves between them from step to step. Both hold
the weights: resident memory is the engine's bytes plus OpenVINO's copy
(``OPENVINO_LOAD_FACTOR``). Measured in the Gemma 3 270M int4 engine, it loses to the CPU EP
alone at every step size (RESULTS.md, "The hybrid runner measured in the engine"): it is a
candidate the build measures (``provider_choice``), not a default.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmc.engine.provider import CPU_EP, ProviderChoice
from llmc.runtime.runners.openvino_runner import PRECISIONS, compile_segments, openvino_available
from llmc.runtime.runners.ort_runner import OrtRunner, step_feed
from llmc.runtime.runners.step_inputs import StepInputs

#: New tokens from which a step runs on OpenVINO's runtime (``HybridRunner``).
MIN_OPENVINO_TOKENS = 8


class HybridRunner(OrtRunner):
    """Runs a CPU engine's small steps on ONNX Runtime and its large ones on OpenVINO's runtime,
    over one KV cache. Implements ``llmc.runtime.runners.runner.Runner``.

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
