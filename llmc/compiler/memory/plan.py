"""How a build uses host memory: stream the weights or load them, and what that will need.

Two paths (``streamed_export``):

- **streamed** (safetensors or streamable GGUF; any target): the float graph is written without
  loading the model, its weights read from the checkpoint one tensor at a time; a quantized
  build then calibrates and quantizes one segment at a time, writing each quantized weight to
  disk as it is made, and holds the engine's weights only where it loads the engine (``cpu``:
  to measure it); ``plan_memory`` gives the formula, ``memory.engine_size`` the engine's bytes.
- **in memory** (other GGUF architectures): the float32 model, its exported graph and the
  quantizer's working copies are all held; peak grows with the model at
  ``IN_MEMORY_FACTOR`` times its float32 bytes (measured: 16 GB for a 2 GB Qwen2.5-0.5B-shaped
  float build, 12-14 GB for 1.07 GB of Gemma 3 270M quantized; ``benchmarks/RESULTS.md``).

With ``--max-build-memory`` the streamed path shrinks its in-flight budget to fit; a build that
cannot fit is refused before any weight is read, with the figure it needs. Without it, the bound
is the host's memory (RAM and swap). The plan is made twice: for the checkpoint's tensors, and
for the model its config describes (``model_dims``: what transformers builds before it meets the
weights), so a config far larger than its tensors is refused here, not in torch's allocator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmc.compiler.frontend.model_source import ModelSource
from llmc.compiler.frontend.streamed_export import can_stream
from llmc.compiler.memory.engine_size import CheckpointShapes, engine_weight_bytes
from llmc.compiler.quantize.formats import FORMATS, WEIGHT_ONLY8
from llmc.errors import BuildConfigError
from llmc.quant.protocol import QuantSpec

GB = 1e9
BASE_BYTES = int(0.8 * GB)
MAX_IN_FLIGHT_BYTES = 512 << 20
MIN_IN_FLIGHT_BYTES = 64 << 20
#: Peak RSS over float32 weight bytes on the in-memory path: float builds, quantized builds.
IN_MEMORY_FACTOR = {False: 8.0, True: 13.0}
#: Tensors of [calibration tokens, hidden] float32 a layer-wise calibration keeps per token: the
#: residual stream between segments, and a layer's input and normalized input.
ACTIVATION_COPIES = 3


@dataclass(frozen=True)
class MemoryPlan:
    """The path a build takes and the peak host memory it expects (bytes).

    Attributes:
        streamed: weights are read one tensor at a time (else the model is loaded whole).
        need_bytes: the expected peak RSS.
        in_flight_bytes: weights read and not yet written while the float graph is written.
        float32_weight_bytes: the checkpoint's weights in float32.
        engine_weight_bytes: the engine's weights, estimated (``memory.engine_size``).
        peak_stage: what sets ``need_bytes``.
    """

    streamed: bool
    need_bytes: int
    in_flight_bytes: int
    float32_weight_bytes: int
    engine_weight_bytes: int = 0
    peak_stage: str = ""

    def to_dict(self) -> dict:
        """The plan as the manifest's ``build_stats.memory_plan`` records it."""
        return {
            "streamed": self.streamed,
            "need_bytes": self.need_bytes,
            "in_flight_bytes": self.in_flight_bytes,
            "float32_weight_bytes": self.float32_weight_bytes,
            "engine_weight_bytes": self.engine_weight_bytes,
            "peak_stage": self.peak_stage,
        }


def plan_memory(
    src: ModelSource,
    quant: str,
    cpu: bool,
    limit_gb: float | None,
    spec: QuantSpec | None = None,
    calib_tokens: int = 0,
    samples_text: bool = False,
    engine_load_factor: float = 1.0,
) -> MemoryPlan:
    """Choose the path for ``src`` built with ``--quant quant`` and check it fits ``limit_gb``
    (None: no limit). A quantized streamed build's plan reads ``spec`` (the build's
    ``QuantSpec``; default: ``quant`` with no exclusions), ``calib_tokens`` (windows x tokens
    per window) and ``samples_text`` (no ``--calib-data``: calibration text is sampled);
    ``engine_load_factor`` is the resident bytes of the runner that measures the engine per
    engine weight byte (ONNX Runtime 1; OpenVINO's runtime more, ``OPENVINO_LOAD_FACTOR``).

    Peak of a streamed build: the process (``BASE_BYTES``) plus the largest of: writing the
    float graph (twice the largest tensor in float32, and the tensors in flight); sampling text
    (the 8-bit sampler engine); calibrating and quantizing one segment at a time (the
    float32 weights of one layer or the largest tensor + GPTQ's Gram matrices of one layer and
    its factorization of the widest weight + the calibration activations; the quantized
    weights are on disk); the accuracy report and the provider measurement (the engine, and
    ONNX Runtime's prepacked copy of a tied float32 vocabulary projection).
    Raises BuildConfigError, before any weight is read, when the plan needs more than the
    limit (without one: the host's memory, ``host_memory_bytes``), or when the plan for the
    model ``src``'s config describes does: the message names the figure and the stage (and
    the config and its dimensions).
    """
    streamable = can_stream(src)
    options = (quant, cpu, limit_gb, spec, calib_tokens, samples_text, engine_load_factor)
    plan = plan_for_shapes(CheckpointShapes.of(src), streamable, *options)  # checks limit_gb
    limit = int(limit_gb * GB) if limit_gb is not None else host_memory_bytes()
    bound = (
        f"--max-build-memory {limit_gb:g}"
        if limit_gb is not None
        else f"this host's {limit / GB:.1f} GB of memory (RAM and swap)"
    )
    if plan.need_bytes > limit:
        raise BuildConfigError(
            f"this build needs about {plan.need_bytes / GB:.1f} GB of host memory (peak: "
            f"{plan.peak_stage}), more than {bound}; build on a host with more memory, or give "
            "--max-build-memory to plan for the memory this build may use"
        )
    implied = src.dims.implied_tensors() if src.dims is not None else None
    if implied is not None:  # the tensors fit: does the model the config describes?
        shapes = CheckpointShapes(implied, False)
        try:  # planned as the tensors were (a limit shrinks the tensors in flight)
            described = plan_for_shapes(shapes, streamable, *options)
        except BuildConfigError:  # over the limit: its figure, unbounded
            described = plan_for_shapes(shapes, streamable, *options[:2], None, *options[3:])
        if described.need_bytes > limit:
            params = sum(math.prod(shape) for _, shape in implied)
            raise BuildConfigError(
                f"{src.dims.source} describes a model of about {params:.3g} parameters "
                f"({src.dims.describe()}; {4 * params / GB:,.1f} GB in float32): building it "
                f"needs about {described.need_bytes / GB:,.1f} GB of host memory (peak: "
                f"{described.peak_stage}), more than {bound}; the checkpoint's tensors need "
                f"{plan.need_bytes / GB:.1f} GB: check the config against them"
            )
    return plan


def host_memory_bytes() -> int:
    """Bytes of memory this host has, RAM and swap: more than that, no build can hold."""
    import psutil

    return psutil.virtual_memory().total + psutil.swap_memory().total


def plan_for_shapes(
    shapes: CheckpointShapes,
    streamable: bool,
    quant: str,
    cpu: bool,
    limit_gb: float | None,
    spec: QuantSpec | None = None,
    calib_tokens: int = 0,
    samples_text: bool = False,
    engine_load_factor: float = 1.0,
) -> MemoryPlan:
    """``plan_memory`` for a checkpoint given by its tensor shapes (``streamable``: its weights
    can be read one tensor at a time), so a plan can be projected for a model not on disk
    (``benchmarks/project_build_memory.py``). Raises BuildConfigError as ``plan_memory``."""
    fmt = FORMATS[quant]
    total, largest = shapes.float32_bytes()
    # Formats the CPU emulates (FP8, NVFP4, MXFP8) stream too: their float32 weights are
    # written as they are quantized (``QuantFormat.cpu_weight``).
    streamed = streamable
    limit = None if limit_gb is None else int(limit_gb * GB)
    if not streamed:
        need = BASE_BYTES + int(IN_MEMORY_FACTOR[fmt.quantizes] * total)
        if limit is not None and need > limit:
            raise BuildConfigError(
                f"this build needs about {need / GB:.1f} GB of host memory (GGUF "
                "architectures converted as a whole hold the model in "
                f"memory: {IN_MEMORY_FACTOR[fmt.quantizes]:.0f}x the {total / GB:.2f} GB of "
                f"float32 weights), over --max-build-memory {limit_gb:g}; give the build more "
                "memory"
            )
        return MemoryPlan(False, need, 0, total, 0, "the model loaded whole")
    spec = (spec or QuantSpec(quant=quant)) if fmt.quantizes else None
    engine = engine_weight_bytes(shapes, spec)
    in_flight = MAX_IN_FLIGHT_BYTES
    write = 2 * largest
    if limit is not None:
        in_flight = max(min(in_flight, limit - BASE_BYTES - write), MIN_IN_FLIGHT_BYTES)
    stages = {
        "write the float graph (twice the largest tensor, tensors in flight)": write + in_flight
    }
    if cpu:  # a GPU stage is measured where it is finished, on the GPU builder
        # a tied table is mapped apart for the Gather and the projection (``single_graph``):
        # the projection's prepacked copy replaces its mapping, the Gather pages in rows
        stages["load the engine to measure it"] = int(engine * engine_load_factor)
    if spec is not None:
        gptq = spec.weight_rounding == "gptq"
        gram = shapes.largest_gram_bytes() if gptq else 0
        # GPTQ factors one weight at a time in two [K, K] float64 buffers (gptq.py)
        factor = 2 * 8 * shapes.largest_in_features() ** 2 if gptq else 0
        acts = ACTIVATION_COPIES * 4 * shapes.hidden_size() * calib_tokens
        working = max(largest, shapes.layer_bytes() + gram + factor) + acts
        # the quantized weights go to disk as they are made (``TensorSpill``)
        stages["calibrate and quantize one segment at a time"] = working
        if samples_text:
            sampler = engine_weight_bytes(shapes, QuantSpec(quant=WEIGHT_ONLY8))
            stages["sample calibration text (8-bit sampler engine)"] = sampler
    peak_stage = max(stages, key=stages.__getitem__)
    need = BASE_BYTES + stages[peak_stage]
    if limit is not None and need > limit:
        raise BuildConfigError(
            f"this build needs at least {need / GB:.1f} GB of host memory (the process's "
            f"{BASE_BYTES / GB:.1f} GB and {stages[peak_stage] / GB:.2f} GB to {peak_stage}; "
            f"engine weights {engine / GB:.2f} GB), over --max-build-memory {limit_gb:g}"
        )
    return MemoryPlan(True, need, in_flight, total, engine, peak_stage)
