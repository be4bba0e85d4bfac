"""How a build uses host memory: stream the weights or load them, and what that will need.

Two paths (``streaming_export``):

- **streamed** (safetensors or streamable GGUF, cpu target): the float graph is written without
  loading the model, its weights read from the checkpoint one tensor at a time. For ``--quant
  none``, peak = the process's fixed cost (Python, torch, transformers, ONNX Runtime:
  ``BASE_BYTES``) + the larger of (a) the tensors in flight while the float graph is written
  and two copies of the largest float32 tensor while ONNX Runtime optimizes the segment
  holding it, and (b) the engine's weights, which the execution-provider measurement loads as
  the server will. Quantized builds then calibrate with ONNX Runtime reading the float graph's
  weights from disk: about the float32 bytes and the quantizer's statistics
  (``STREAMED_QUANT_FACTOR``).
- **in memory** (other GGUF, GPU targets, FP8 emulation on cpu): the float32 model, its exported
  graph and the quantizer's working copies are all held; peak grows with the model at
  ``IN_MEMORY_FACTOR`` times its float32 bytes (measured: 16 GB for a 2 GB Qwen2.5-0.5B-shaped
  float build, 12-14 GB for 1.07 GB of Gemma 3 270M quantized; ``benchmarks/RESULTS.md``).

With ``--max-build-memory`` the streamed path shrinks its in-flight budget to fit; a build that
cannot fit is refused before any weight is read, with the figure it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmc.compiler.checkpoint_weights import index_safetensors
from llmc.compiler.gguf_file import check_gguf
from llmc.compiler.model_source import ModelSource
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.streaming_export import can_stream
from llmc.errors import BuildConfigError
from llmc.quant.protocol import QuantFormat

GB = 1e9
BASE_BYTES = int(0.8 * GB)
MAX_IN_FLIGHT_BYTES = 512 << 20
MIN_IN_FLIGHT_BYTES = 64 << 20
#: Peak RSS over float32 weight bytes on the in-memory path: float builds, quantized builds.
IN_MEMORY_FACTOR = {False: 8.0, True: 13.0}
#: Peak RSS over float32 weight bytes of a streamed quantized build, the worst measured: 12.7 GB
#: for the 1.98 GB Qwen2.5-0.5B-shaped int4 build (AWQ's activation statistics, GPTQ's Gram
#: matrices of every layer, the weights read and their quantized copies; int8: 7.4 GB).
STREAMED_QUANT_FACTOR = 6.5


@dataclass(frozen=True)
class MemoryPlan:
    """The path a build takes and the peak host memory it expects (bytes)."""

    streamed: bool
    need_bytes: int
    in_flight_bytes: int
    float32_weight_bytes: int

    def to_dict(self) -> dict:
        """The plan as the manifest's ``build_stats.memory_plan`` records it."""
        return {
            "streamed": self.streamed,
            "need_bytes": self.need_bytes,
            "in_flight_bytes": self.in_flight_bytes,
            "float32_weight_bytes": self.float32_weight_bytes,
        }


def _float32_sizes(src: ModelSource) -> tuple[int, int]:
    """(total, largest) float32 bytes of the checkpoint's tensors, from the headers' shapes (a
    GGUF tensor dequantized: 4 bytes an element, whatever it is stored in)."""
    if src.gguf_file is not None:
        sizes = [4 * math.prod(t.dims) for f in src.weight_files for t in check_gguf(f).tensors]
    else:
        index = index_safetensors(src.weight_files)
        sizes = [4 * int(loc.length / loc.dtype.itemsize) for loc in index.values()]
    return sum(sizes), max(sizes, default=0)


def plan_memory(src: ModelSource, quant: str, cpu: bool, limit_gb: float | None) -> MemoryPlan:
    """Choose the path for ``src`` built with ``--quant quant`` and check it fits ``limit_gb``
    (None: no limit).

    Raises BuildConfigError, before any weight is read, when the plan needs more than the limit:
    the message gives the figure needed and what would fit.
    """
    fmt = FORMATS[quant]
    total, largest = _float32_sizes(src)
    # A format whose CPU lowering rewrites weights in memory (FP8 emulation) takes that path.
    rewrites = type(fmt).rewrite_for_cpu is not QuantFormat.rewrite_for_cpu
    streamed = cpu and can_stream(src) and not rewrites
    limit = None if limit_gb is None else int(limit_gb * GB)
    if not streamed:
        need = BASE_BYTES + int(IN_MEMORY_FACTOR[fmt.quantizes] * total)
        if limit is not None and need > limit:
            why = (
                "quantized builds of GGUF files or for GPU targets hold the model in memory"
                if fmt.quantizes
                else "GGUF files and GPU targets are loaded whole"
            )
            raise BuildConfigError(
                f"this build needs about {need / GB:.1f} GB of host memory ({why}: "
                f"{IN_MEMORY_FACTOR[fmt.quantizes]:.0f}x the {total / GB:.2f} GB of float32 "
                f"weights), over --max-build-memory {limit_gb:g}; a safetensors checkpoint for "
                "--arch cpu streams its weights, or give the build more memory"
            )
        return MemoryPlan(False, need, 0, total)
    if fmt.quantizes:
        # Calibration runs the float graph (its weights in ONNX Runtime), with the quantizer's
        # statistics and the quantized weights beside it.
        need = BASE_BYTES + int(STREAMED_QUANT_FACTOR * total)
        if limit is not None and need > limit:
            raise BuildConfigError(
                f"this build needs about {need / GB:.1f} GB of host memory (calibration runs "
                f"the {total / GB:.2f} GB float32 graph: {STREAMED_QUANT_FACTOR:g}x with the "
                f"statistics and quantized weights), over --max-build-memory {limit_gb:g}; "
                "--quant none streams in less, or give the build more memory"
            )
        return MemoryPlan(True, need, MAX_IN_FLIGHT_BYTES, total)
    fixed = BASE_BYTES + 2 * largest
    serving = BASE_BYTES + total  # the provider measurement loads the engine
    in_flight = MAX_IN_FLIGHT_BYTES
    if limit is not None:
        in_flight = min(in_flight, limit - fixed)
        need = max(fixed + MIN_IN_FLIGHT_BYTES, serving)
        if in_flight < MIN_IN_FLIGHT_BYTES or serving > limit:
            raise BuildConfigError(
                f"this build needs at least {need / GB:.1f} GB of host memory (the process's "
                f"{BASE_BYTES / GB:.1f} GB, and the larger of: twice its largest tensor of "
                f"{largest / GB:.2f} GB in float32 with {MIN_IN_FLIGHT_BYTES >> 20} MiB of "
                f"tensors in flight; the engine's {total / GB:.2f} GB of weights, loaded to "
                f"measure it as the server will), over --max-build-memory {limit_gb:g}"
            )
    return MemoryPlan(True, max(fixed + in_flight, serving), in_flight, total)
