"""Build a TensorRT plan from a portable stage's ONNX graph (TensorRT's Python API).

``build_network_plan`` is the build both builders share (parse, configure, profile, timing
cache, progress, cancel, write): it runs in the test suite on this CPU host with TensorRT for
RTX's module (``rtx/child.py``). ``build_plan``, its TensorRT 11 front (QDP plugin registration,
hardware compatibility), has NEVER RUN: ``import tensorrt`` is impossible here (DESIGN §6).
``tensorrt`` is imported inside ``build_plan``, so importing this module never needs it.

API used, per the TensorRT Python API reference (docs.nvidia.com/deeplearning/tensorrt, 11.x):
- ``trt.Builder(logger)``; ``builder.create_network(flags)`` with
  ``1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)`` — deprecated and ignored in
  TensorRT 11.0 ("Strongly typed mode is always enabled"), required on 10.x, so set when present;
- ``trt.OnnxParser(network, logger).parse_from_file(path)`` (reads external weights beside the
  file), errors from ``parser.num_errors`` / ``parser.get_error(i)``;
- ``builder.create_builder_config()``: ``builder_optimization_level`` (0-5, default 3),
  ``hardware_compatibility_level`` (``trt.HardwareCompatibilityLevel.NONE | AMPERE_PLUS |
  SAME_COMPUTE_CAPABILITY``), ``create_timing_cache(bytes)`` + ``set_timing_cache(cache,
  ignore_mismatch=False)`` and ``get_timing_cache().serialize()`` (``ITimingCache``; the same
  calls as Polygraphy's ``CreateConfig``), ``progress_monitor`` (an ``IProgressMonitor``);
- ``builder.create_optimization_profile()``, ``IOptimizationProfile.set_shape(name, min, opt,
  max)``, ``config.add_optimization_profile(profile)``;
- ``builder.build_serialized_network(network, config)`` -> ``IHostMemory`` or None (failure or
  cancellation: ``IProgressMonitor.step_complete`` returned False); run in a worker thread so
  Ctrl-C in the main thread can cancel it (``_build_cancellable``).
The paged-attention plugin registers itself through
``llmc.plugins.paged_attention.trt_register.register()``. What the plugin needs from the build,
per TensorRT 11.1's sources (``trt_plugin.py`` quotes them): ``PreviewFeature.
ALIASED_PLUGIN_IO_10_03`` on, or its caches are never written (``NvInferRuntime.h``,
``getAliasedInput``); the AOT implementation, chosen by each node's ``aot=1`` and by the
``PREFER_AOT_PYTHON_PLUGINS`` network flag for any node without one (``importerUtils.cpp``,
``createPlugin``); a plan that runs only on the builder's compute capability (the AOT kernel
is PTX for one ``sm_XXa`` target, which no other architecture loads: :func:`check_hardware_compat`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from llmc.engine.lora import LORA_SLOT_IDS, is_lora_input
from llmc.errors import LlmcError
from llmc.plugins.paged_attention import trt_register

PLAN_FILE = "engine.plan"
HARDWARE_COMPAT_LEVELS = {
    "none": "NONE",
    "ampere+": "AMPERE_PLUS",
    "same-cc": "SAME_COMPUTE_CAPABILITY",
}


class TensorRTBuildError(LlmcError):
    """TensorRT's parser or builder failed; the message holds its errors."""


def check_hardware_compat(hardware_compat: str) -> None:
    """Refuse a hardware-compatibility level the AOT paged-attention kernel cannot honour:
    ``ampere+`` plans run on any sm80+ GPU, but the kernel is PTX for the builder's
    architecture-specific target (Triton writes ``.target sm_90a`` for sm90, PTX ISA: "a"
    targets run only on that exact compute capability). Raises TensorRTBuildError."""
    if hardware_compat == "ampere+":
        raise TensorRTBuildError(
            "--hardware-compat ampere+ cannot hold the paged-attention plugin's AOT kernel "
            "(PTX for the builder's GPU only); build one engine per GPU architecture with "
            "--hardware-compat none or same-cc"
        )


@dataclass(frozen=True)
class ShapeRange:
    """One input's optimization-profile shapes (min, opt, max), in elements per dim."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def optimization_profile(
    num_kv_heads: int,
    head_dim: int,
    num_layers: int,
    block_size: int,
    max_num_tokens: int,
    max_batch: int,
    max_seq_len: int,
    lora: bool = False,
) -> dict[str, ShapeRange]:
    """The one optimization profile of an engine, by graph input (DESIGN §3 names):

    - T packed tokens (``input_ids``, ``positions``, ``slot_mapping``, and with ``lora`` the
      LoRA engine's ``lora_slot_ids``): 1 .. max_num_tokens,
      opt min(max_num_tokens, 256) (a mixed step of decodes and a prefill chunk);
    - B sequences (``seq_lens``; ``query_start_loc`` has B+1), S sampled rows
      (``logits_indices``): 1 .. max_batch, opt max_batch (full decode batches);
    - M blocks per sequence (``block_tables`` [B, M]): 1 .. ceil(max_seq_len / block_size);
    - N cache blocks (each cache [N, block_size, KVH, D]): 1 .. M_max * max_batch, the pool the
      runtime allocates by default (``engine_loader.plan_num_blocks``).
    """
    per_seq = math.ceil(max_seq_len / block_size)
    pool = per_seq * max_batch
    t_opt = min(max_num_tokens, 256)

    def r(lo, opt, hi) -> ShapeRange:
        return ShapeRange(tuple(lo), tuple(opt), tuple(hi))

    profile = {
        name: r((1,), (t_opt,), (max_num_tokens,))
        for name in ("input_ids", "positions", "slot_mapping", *((LORA_SLOT_IDS,) if lora else ()))
    }
    profile["logits_indices"] = r((1,), (max_batch,), (max_batch,))
    profile["seq_lens"] = r((1,), (max_batch,), (max_batch,))
    profile["query_start_loc"] = r((2,), (max_batch + 1,), (max_batch + 1,))
    profile["block_tables"] = r((1, 1), (max_batch, per_seq), (max_batch, per_seq))
    cache = (block_size, num_kv_heads, head_dim)
    for i in range(num_layers):
        for kind in ("key_cache", "value_cache"):
            profile[f"{kind}.{i}"] = r((1, *cache), (pool, *cache), (pool, *cache))
    return profile


class BuildPhases:
    """Progress of TensorRT's optimizer phases, fed by an ``IProgressMonitor`` (thread-safe).

    Top-level phases (no parent) drive ``tick(done, total)`` of the build stage; nested phases
    are counted. ``cancel()`` (from the Ctrl-C handler) makes ``step`` return False, which asks
    TensorRT to stop the build ("step_complete returns False to request cancellation",
    ``IProgressMonitor`` reference).
    """

    def __init__(self, tick=None):
        self._tick = tick
        self._lock = threading.Lock()
        self.cancelled = False
        self.phases: dict[str, tuple[str | None, int, int]] = {}  # name -> (parent, done, total)
        self.finished: list[str] = []

    def start(self, name: str, parent: str | None, num_steps: int) -> None:
        with self._lock:
            self.phases[name] = (parent, 0, max(int(num_steps), 1))
            self._report(name)

    def step(self, name: str, step: int) -> bool:
        with self._lock:
            parent, _, total = self.phases.get(name, (None, 0, 1))
            self.phases[name] = (parent, min(step + 1, total), total)
            self._report(name)
            return not self.cancelled

    def finish(self, name: str) -> None:
        with self._lock:
            self.phases.pop(name, None)
            self.finished.append(name)

    def cancel(self) -> None:
        self.cancelled = True

    def _report(self, name: str) -> None:
        parent, done, total = self.phases[name]
        if parent is None and self._tick is not None:
            self._tick(done, total)


def _monitor_class(trt):
    class RichProgressMonitor(trt.IProgressMonitor):
        """``trt.IProgressMonitor`` forwarding to ``BuildPhases``."""

        def __init__(self, phases: BuildPhases):
            trt.IProgressMonitor.__init__(self)
            self.phases = phases

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.phases.start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name, step):
            return self.phases.step(phase_name, step)

        def phase_finish(self, phase_name):
            self.phases.finish(phase_name)

    return RichProgressMonitor


def _build_cancellable(build, phases: BuildPhases):
    """Run ``build()`` in a worker thread while the main thread waits in short joins, so Ctrl-C
    (KeyboardInterrupt, raised only in the main thread) arrives during the build whichever
    thread TensorRT calls the monitor on; it cancels through ``phases`` and the build returns
    None at TensorRT's next step."""
    result: dict = {}

    def work() -> None:
        try:
            result["plan"] = build()
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    worker = threading.Thread(target=work, name="tensorrt-build", daemon=True)
    worker.start()
    while worker.is_alive():
        try:
            worker.join(0.2)
        except KeyboardInterrupt:
            phases.cancel()
    if "error" in result:
        raise result["error"]
    return result.get("plan")


def build_plan(
    onnx_path: Path,
    plan_path: Path,
    profile: dict[str, ShapeRange],
    builder_opt_level: int = 3,
    hardware_compat: str = "none",
    timing_cache: str | None = None,
    tick=None,
) -> dict:
    """Parse ``onnx_path``, build with ``profile`` with TensorRT 11 and write the plan to
    ``plan_path``.

    Returns what the engine manifest records under ``tensorrt``. Raises TensorRTBuildError
    (parser or builder errors), KeyboardInterrupt when Ctrl-C cancelled the build.
    """
    import tensorrt as trt

    check_hardware_compat(hardware_compat)
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    trt_register.register()
    level = HARDWARE_COMPAT_LEVELS[hardware_compat]

    def configure(config) -> None:
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)

    # STRONGLY_TYPED: ignored by 11.0+, required by 10.x. PREFER_AOT_PYTHON_PLUGINS: the AOT
    # implementation for a plugin node without an "aot" attribute (importerUtils.cpp,
    # createPlugin; tensorrt/plugin/_lib.py raises when both exist and nothing chooses).
    flags = ("STRONGLY_TYPED", "PREFER_AOT_PYTHON_PLUGINS")
    request = PlanRequest(onnx_path, plan_path, profile, builder_opt_level, timing_cache)
    record = build_network_plan(trt, logger, flags, configure, request, tick)
    return record | {"hardware_compatibility": hardware_compat, "plugin_implementation": "aot"}


@dataclass(frozen=True)
class PlanRequest:
    """One plan to build: the stage's graph, where the plan goes, the optimization profile,
    the builder's optimization level (0-5) and the timing cache file (None: none)."""

    onnx_path: Path
    plan_path: Path
    profile: dict[str, ShapeRange]
    builder_opt_level: int = 3
    timing_cache: str | None = None


def build_network_plan(trt, logger, flag_names, configure, request: PlanRequest, tick=None):
    """The build every TensorRT flavour shares, on module ``trt`` (``tensorrt`` or
    ``tensorrt_rtx_bindings``, whose plugin creators are registered already): parse the
    graph into a network made with the ``flag_names`` this module has, ``configure(config)``
    the target, build with the request's profile, preview features and timing cache, write
    the plan. Returns the manifest record's common part. Raises TensorRTBuildError,
    KeyboardInterrupt (Ctrl-C cancelled the build)."""
    builder = trt.Builder(logger)
    flags = 0
    for name in flag_names:
        flag = getattr(trt.NetworkDefinitionCreationFlag, name, None)
        if flag is not None:
            flags |= 1 << int(flag)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    onnx_path = request.onnx_path
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n  ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTBuildError(f"TensorRT's ONNX parser rejected {onnx_path}:\n  {errors}")
    config = builder.create_builder_config()
    config.builder_optimization_level = request.builder_opt_level
    configure(config)
    # NvInferRuntime.h v11.1, IPluginV3OneBuildV2::getAliasedInput: "only be called and have an
    # effect when PreviewFeature::kALIASED_PLUGIN_IO_10_03 is turned on".
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    cache_path = Path(request.timing_cache) if request.timing_cache else None
    _set_timing_cache(config, cache_path)
    config.add_optimization_profile(_trt_profile(builder, network, request.profile))
    phases = BuildPhases(tick)
    monitor = _monitor_class(trt)(phases)
    config.progress_monitor = monitor
    plan = _build_cancellable(lambda: builder.build_serialized_network(network, config), phases)
    if plan is None:
        if phases.cancelled:
            raise KeyboardInterrupt("TensorRT build cancelled")
        raise TensorRTBuildError("TensorRT's builder failed; its log above says why")
    request.plan_path.write_bytes(bytes(plan))
    if cache_path is not None:
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return {
        "version": trt.__version__,
        "plan": request.plan_path.name,
        "builder_optimization_level": request.builder_opt_level,
        "preview_features": ["ALIASED_PLUGIN_IO_10_03"],
        "profiles": [{name: asdict(r) for name, r in request.profile.items()}],
    }


def _set_timing_cache(config, cache_path: Path | None) -> None:
    """Give ``config`` the timing cache at ``cache_path`` (empty when absent or None)."""
    blob = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
    # NvInfer.h, IBuilderConfig::setTimingCache: "true if set successfully" (false: the cache
    # was written for another device or TensorRT version and ignoreMismatch is false).
    if not config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False):
        raise TensorRTBuildError(
            f"TensorRT refused the timing cache {cache_path} (written on another GPU or "
            "TensorRT version); delete it or give --timing-cache a new path"
        )


def _trt_profile(builder, network, profile: dict[str, ShapeRange]):
    """The network's one optimization profile: ``profile``'s shapes for every input (but the
    static LoRA slot tensors)."""
    trt_profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        if name not in profile and is_lora_input(name) and min(network.get_input(i).shape) > 0:
            continue  # a LoRA engine's slot tensors: static shapes need no profile
        if name not in profile:
            raise TensorRTBuildError(f"network input {name!r} has no optimization profile")
        shapes = profile[name]
        trt_profile.set_shape(name, shapes.min, shapes.opt, shapes.max)
    return trt_profile
