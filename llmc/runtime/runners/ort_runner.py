"""The ONNX Runtime runner of CPU engines (DESIGN §6-7).

The KV cache is this runner's numpy arrays, only ever written in place at the step's slots. A
step runs in one of two forms of the same optimized nodes, with bit-identical results:

- one graph (``engine.onnx``, ``llmc.compiler.backends.onnxruntime.single_graph``): one ORT run per
step, the
  PagedAttention nodes run by the custom op (``llmc/plugins/paged_attention/ort_op.c``) on ORT's
  thread pool, the caches fed as graph inputs. Used when the engine has the graph, the custom op
  is built and the provider is the CPU EP: 10-14% faster per decode step than segments (Gemma 3
  270M float32, 16 sequences; benchmarks/RESULTS.md).
- segments (``llmc.engine.split``, ``llmc.engine.plan``): segment 0, plugin 0, segment 1, ...,
  segment L, the plugin as the ctypes kernel (``cpu.py``) between ORT runs. The fallback, and the
  form calibration uses (it reads activations at segment boundaries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmc.engine.kv_cache import NUMPY_DTYPES, kv_cache_numpy_dtype
from llmc.engine.plan import ExecutionPlan, PluginCall, load_plan
from llmc.engine.provider import ProviderChoice, provider_for_dtype
from llmc.engine.split import split_at_plugins
from llmc.plugins.paged_attention import ort_op
from llmc.plugins.paged_attention.cpu import paged_attention_cpu
from llmc.runtime.runners.execution_provider import bind_provider
from llmc.runtime.runners.lora_feed import lora_feed, zero_slots
from llmc.runtime.runners.ort_env import session_options
from llmc.runtime.runners.step_inputs import StepInputs


class OrtRunner:
    """Runs a CPU engine directory. Implements ``llmc.runtime.runners.runner.Runner``.

    Args:
        engine_dir: the engine directory (``plan.json``, ``segments/``).
        num_blocks: KV blocks per layer; the cache takes ``2 * num_layers * num_blocks *
            block_size * num_kv_heads * head_dim`` elements of 4 bytes (``kv_cache_dtype``
            "auto": float32) or 1 ("fp8": float8_e4m3fn, "int8").
        threads: ORT intra-op threads (the attention kernel has its own pool, see its C file).
        provider: the execution provider (default: the CPU EP).
        single_graph: run ``engine.onnx`` with the custom op (True), the segments (False), or
            the graph when it can (None, the default). True raises RuntimeError when the engine
            has no graph, the custom op is not built, or the provider is not the CPU EP.
        profile_file_prefix: turn ONNX Runtime's profiler on; each session writes
            ``PREFIX_<time>.json`` at `end_profiling` (``benchmarks/profile_step.py``).
    """

    def __init__(
        self,
        engine_dir: str | Path,
        num_blocks: int,
        threads: int | None = None,
        provider: ProviderChoice | None = None,
        single_graph: bool | None = None,
        profile_file_prefix: str | None = None,
    ):
        import onnxruntime as ort

        engine_dir = Path(engine_dir)
        plan: ExecutionPlan = load_plan(engine_dir)
        provider = provider or provider_for_dtype("float32")
        opts = session_options(threads or 2)
        if profile_file_prefix is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_file_prefix
        if provider.optimize_at_build:
            # The saved segments are already optimized for this host at build time.
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        providers = bind_provider(opts, provider)
        missing = []
        if single_graph is not False:
            if not plan.graph:
                missing.append("the engine has no engine.onnx (built before it existed)")
            if not provider.optimize_at_build:
                missing.append(f"the provider is {provider.name}, not the CPU EP")
            elif not ort_op.register(opts):
                missing.append("the PagedAttention custom op is not built (see setup.py)")
        if single_graph and missing:
            raise RuntimeError(f"cannot run {engine_dir} as one graph: {'; '.join(missing)}")
        use_graph = single_graph is not False and not missing
        files = [plan.graph] if use_graph else [s.file for s in plan.segments]
        sessions = [
            ort.InferenceSession(str(engine_dir / f), opts, providers=providers) for f in files
        ]
        self._setup(plan, sessions, num_blocks, single_graph=use_graph)

    @classmethod
    def from_model(
        cls,
        model,
        num_blocks: int,
        threads: int | None = None,
        extra_outputs: tuple[str, ...] = (),
        external_data_dir: Path | None = None,
    ) -> OrtRunner:
        """A runner over an in-memory engine graph (``onnx.ModelProto`` with plugin nodes) on the
        CPU EP, optimized at load (ORT_ENABLE_BASIC). Used by calibration and the accuracy report
        to run the unquantized graph; ``extra_outputs`` names tensors that ``run_step`` must
        return besides the logits; ``external_data_dir`` is where the weights of a graph holding
        external-data references are (a streamed build's float graph). Raises ValueError if a
        name is not in the graph."""
        import onnxruntime as ort

        segments, plan = split_at_plugins(model, extra_outputs=extra_outputs)
        opts = graph_session_options(threads, external_data_dir)
        sessions = [
            ort.InferenceSession(seg.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for seg in segments
        ]
        runner = cls.__new__(cls)
        runner._setup(plan, sessions, num_blocks, single_graph=False)
        return runner

    def _setup(
        self, plan: ExecutionPlan, sessions: list, num_blocks: int, single_graph: bool
    ) -> None:
        self.plan = plan
        self._sessions = sessions
        #: True when a step is one run of ``engine.onnx``, False when it runs in segments.
        self.single_graph = single_graph
        first = self.plan.plugins[0]
        self.num_blocks = num_blocks
        self.block_size = first.block_size
        # One key and one value cache per layer: [num_blocks, block_size, KVH, D] in the layer's
        # kv_cache_dtype (ValueError for an unknown one); the kernel reads the dtype from them.
        self.kv_caches = {
            name: resident_zeros(
                (num_blocks, p.block_size, p.num_kv_heads, p.head_dim),
                kv_cache_numpy_dtype(p.kv_cache_dtype),
            )
            for p in self.plan.plugins
            for name in p.inputs[3:5]
        }
        self._graph_inputs = [i.name for i in sessions[0].get_inputs()] if single_graph else []
        # The caches as ORT values over the same memory (ORT takes no numpy FP8 arrays).
        self._cache_values = (
            {name: _ort_value(cache) for name, cache in self.kv_caches.items()}
            if single_graph
            else {}
        )
        logits_info = self._sessions[-1].get_outputs()[0]
        self.vocab_size = int(logits_info.shape[-1])
        #: The adapter slot tensors of a LoRA engine (zeros until an adapter is loaded into
        #: them, ``llmc.runtime.lora``), by input name; empty for an engine without LoRA.
        self.lora_slots = zero_slots(
            (i.name, i.shape) for session in sessions for i in session.get_inputs()
        )

    def end_profiling(self) -> list[str]:
        """Stop ONNX Runtime's profiler (``profile_file_prefix``); the JSON trace files
        written, one per session (Chrome trace format, durations in microseconds)."""
        return [session.end_profiling() for session in self._sessions]

    def execute(self, step: StepInputs) -> np.ndarray:
        """Run one step; returns logits [len(step.logits_indices), vocab] float32."""
        return self.run_step(step)[self.plan.logits]

    def run_step(self, step: StepInputs) -> dict[str, np.ndarray]:
        """Run one step; returns every tensor the segments output (the logits under
        ``self.plan.logits``, plus the ``extra_outputs`` of ``from_model``; the logits alone
        in single-graph form).

        Raises:
            ValueError: the step's attention metadata is inconsistent (a slot or block id
                outside the cache, ...); nothing was written to the cache.
        """
        env = step_feed(step) | lora_feed(step, self.lora_slots)
        if self.single_graph:
            return self._run_graph(env)
        return self._run_segments(step, env)

    def _run_graph(self, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (session,) = self._sessions
        feed = {n: env[n] if n in env else self._cache_values[n] for n in self._graph_inputs}
        try:
            (logits,) = session.run([self.plan.logits], feed)
        except Exception as e:  # ORT's pybind errors share no base class but Exception
            message = str(e)
            if "PagedAttention: " not in message:
                raise
            raise ValueError(
                f"bad attention metadata: {message.split('PagedAttention: ')[-1]}"
            ) from e
        return {self.plan.logits: logits}

    def _run_segments(
        self, step: StepInputs, env: dict[str, np.ndarray], sessions: list | None = None
    ) -> dict[str, np.ndarray]:
        """The step through the segments' ``sessions`` (default: this runner's own), each
        plugin call on the numpy KV caches between them."""
        plugins = self.plan.plugins
        sessions = self._sessions if sessions is None else sessions
        for i, (spec, sess) in enumerate(zip(self.plan.segments, sessions, strict=True)):
            outs = sess.run(spec.outputs, {n: env[n] for n in spec.inputs})
            env.update(zip(spec.outputs, outs, strict=True))
            if i < len(plugins):
                p = plugins[i]
                caches = (self.kv_caches[p.inputs[3]], self.kv_caches[p.inputs[4]])
                env[p.output] = run_plugin(p, env, caches, step)
        return env


def resident_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array whose pages are all mapped now. Why: ``np.zeros`` maps its pages at their
    first write, and the block pool hands out every block of a fresh cache before reusing one,
    so each step of a new server wrote into unmapped pages: a 128-token prefill of Gemma 3 270M
    took ~2 ms more (~5%) until the whole cache had been written once. Writing it here moves
    that cost to load (~0.3 s for 2 GiB) and makes a cache the host cannot hold fail there."""
    array = np.zeros(shape, dtype)
    array.fill(0)
    return array


def step_feed(step: StepInputs) -> dict[str, np.ndarray]:
    """The engine graph's inputs of ``step``, by input name."""
    return {
        "input_ids": step.input_ids,
        "positions": step.positions,
        "logits_indices": step.logits_indices,
        "seq_lens": step.seq_lens,
        "query_start_loc": step.query_start_loc,
        "block_tables": step.block_tables,
        "slot_mapping": step.slot_mapping,
    }


def graph_session_options(threads: int | None, external_data_dir: Path | None = None):
    """Session options of an in-memory graph's segments (``OrtRunner.from_model``,
    ``LayerwiseRunner``): optimized at load (ORT_ENABLE_BASIC), weights of external-data
    references read from ``external_data_dir``."""
    import onnxruntime as ort

    opts = session_options(threads or 2)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    if external_data_dir is not None:
        opts.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(external_data_dir)
        )
    return opts


def run_plugin(
    p: PluginCall,
    env: dict[str, np.ndarray],
    caches: tuple[np.ndarray, np.ndarray],
    step: StepInputs,
) -> np.ndarray:
    """Plugin call ``p`` on ``env``'s q, k, v ([T, H*D], [T, KVH*D] float32) with the layer's
    (key, value) ``caches``, as the CPU kernel (``paged_attention_cpu``): writes the step's
    keys and values into the caches, returns the attention output [T, H*D]. Raises ValueError
    on inconsistent attention metadata."""
    q, k, v = (env[n] for n in p.inputs[:3])
    return paged_attention_cpu(
        q,
        k,
        v,
        *caches,
        step.seq_lens,
        step.query_start_loc,
        step.block_tables,
        step.slot_mapping,
        **p.kernel_arguments(),
        fpmath_mode=p.fpmath_mode,
    )


def _ort_value(cache: np.ndarray):
    """An ``onnxruntime.OrtValue`` over ``cache``'s memory (not a copy): ORT writes to it."""
    import onnx
    import onnxruntime as ort

    if cache.dtype == NUMPY_DTYPES["fp8"]:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            cache.view(np.uint8), onnx.TensorProto.FLOAT8E4M3FN
        )
    return ort.OrtValue.ortvalue_from_numpy(cache)
