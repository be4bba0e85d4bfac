"""The ONNX Runtime runner of CPU engines (DESIGN §6-7).

A step runs segment 0, plugin 0, segment 1, ..., segment L (see ``llmc.compiler.segment``). ORT
runs the segments; the paged-attention CPU kernel runs between them on the KV cache, which this
runner owns as numpy arrays and which is only ever written in place at the step's slots.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmc.compiler.segment import ExecutionPlan, load_plan
from llmc.runtime.execution_provider import ProviderChoice, bind_provider, provider_for_dtype
from llmc.runtime.ort_env import session_options
from llmc.runtime.step_inputs import StepInputs


class OrtRunner:
    """Runs a CPU engine directory. Implements ``llmc.runtime.runner.Runner``.

    Args:
        engine_dir: the engine directory (``plan.json``, ``segments/``).
        num_blocks: KV blocks per layer; the cache takes ``2 * num_layers * num_blocks *
            block_size * num_kv_heads * head_dim`` elements of 4 bytes (``kv_cache_dtype``
            "auto": float32) or 1 ("fp8": float8_e4m3fn, "int8").
        threads: ORT intra-op threads (the attention kernel has its own pool, see its C file).
        provider: the execution provider (default: the CPU EP).
    """

    def __init__(
        self,
        engine_dir: str | Path,
        num_blocks: int,
        threads: int | None = None,
        provider: ProviderChoice | None = None,
    ):
        import onnxruntime as ort

        engine_dir = Path(engine_dir)
        plan: ExecutionPlan = load_plan(engine_dir)
        provider = provider or provider_for_dtype("float32")
        opts = session_options(threads or 2)
        if provider.optimize_at_build:
            # The saved segments are already optimized for this host at build time.
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        providers = bind_provider(opts, provider)
        sessions = [
            ort.InferenceSession(str(engine_dir / s.file), opts, providers=providers)
            for s in plan.segments
        ]
        self._setup(plan, sessions, num_blocks)

    @classmethod
    def from_model(
        cls,
        model,
        num_blocks: int,
        threads: int | None = None,
        extra_outputs: tuple[str, ...] = (),
    ) -> OrtRunner:
        """A runner over an in-memory engine graph (``onnx.ModelProto`` with plugin nodes) on the
        CPU EP, optimized at load (ORT_ENABLE_BASIC). Used by calibration and the accuracy report
        to run the unquantized graph; ``extra_outputs`` names tensors that ``run_step`` must
        return besides the logits. Raises ValueError if a name is not in the graph."""
        import onnxruntime as ort

        from llmc.compiler.segment import split_at_plugins

        segments, plan = split_at_plugins(model, extra_outputs=extra_outputs)
        opts = session_options(threads or 2)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.log_severity_level = 3
        sessions = [
            ort.InferenceSession(seg.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for seg in segments
        ]
        runner = cls.__new__(cls)
        runner._setup(plan, sessions, num_blocks)
        return runner

    def _setup(self, plan: ExecutionPlan, sessions: list, num_blocks: int) -> None:
        self.plan = plan
        self._sessions = sessions
        first = self.plan.plugins[0]
        self.num_blocks = num_blocks
        self.block_size = first.block_size
        from llmc.plugins.paged_attention.cpu import kv_cache_numpy_dtype, paged_attention_cpu

        # One key and one value cache per layer: [num_blocks, block_size, KVH, D] in the layer's
        # kv_cache_dtype (ValueError for an unknown one); the kernel reads the dtype from them.
        self.kv_caches = {
            name: np.zeros(
                (num_blocks, p.block_size, p.num_kv_heads, p.head_dim),
                kv_cache_numpy_dtype(p.kv_cache_dtype),
            )
            for p in self.plan.plugins
            for name in p.inputs[3:5]
        }
        logits_info = self._sessions[-1].get_outputs()[0]
        self.vocab_size = int(logits_info.shape[-1])
        self._attention = paged_attention_cpu

    def execute(self, step: StepInputs) -> np.ndarray:
        """Run one step; returns logits [len(step.logits_indices), vocab] float32."""
        return self.run_step(step)[self.plan.logits]

    def run_step(self, step: StepInputs) -> dict[str, np.ndarray]:
        """Run one step; returns every tensor the segments output (the logits under
        ``self.plan.logits``, plus the ``extra_outputs`` of ``from_model``)."""
        env: dict[str, np.ndarray] = {
            "input_ids": step.input_ids,
            "positions": step.positions,
            "logits_indices": step.logits_indices,
            "seq_lens": step.seq_lens,
            "query_start_loc": step.query_start_loc,
            "block_tables": step.block_tables,
            "slot_mapping": step.slot_mapping,
        }
        plugins = self.plan.plugins
        for i, (spec, sess) in enumerate(zip(self.plan.segments, self._sessions, strict=True)):
            outs = sess.run(spec.outputs, {n: env[n] for n in spec.inputs})
            env.update(zip(spec.outputs, outs, strict=True))
            if i < len(plugins):
                p = plugins[i]
                q, k, v = (env[n] for n in p.inputs[:3])
                env[p.output] = self._attention(
                    q,
                    k,
                    v,
                    self.kv_caches[p.inputs[3]],
                    self.kv_caches[p.inputs[4]],
                    step.seq_lens,
                    step.query_start_loc,
                    step.block_tables,
                    step.slot_mapping,
                    num_heads=p.num_heads,
                    num_kv_heads=p.num_kv_heads,
                    head_dim=p.head_dim,
                    scale=p.scale,
                    sliding_window=p.sliding_window or None,
                    logit_softcap=p.logit_softcap or None,
                    k_scale=p.k_scale,
                    v_scale=p.v_scale,
                )
        return env
