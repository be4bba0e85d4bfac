"""The runner of a cpu engine, by the provider its manifest records: ONNX Runtime's
(``OrtRunner``, CPU or OpenVINO execution provider), OpenVINO's runtime on the segments
(``OpenVinoRunner``), or both by step size (``HybridRunner``)."""

from __future__ import annotations

from pathlib import Path

from llmc.engine.provider import HYBRID, OPENVINO_RUNTIME, ProviderChoice, provider_for_dtype
from llmc.runtime.runners.ort_runner import OrtRunner


def cpu_runner(
    engine_dir: str | Path,
    num_blocks: int,
    threads: int | None = None,
    provider: ProviderChoice | None = None,
    single_graph: bool | None = None,
) -> OrtRunner:
    """A runner over ``engine_dir`` with ``num_blocks`` KV blocks per layer on ``provider``
    (default: the CPU EP). ``single_graph`` as ``OrtRunner``'s; OpenVINO's runtime always runs
    the segments; the hybrid with ``single_graph=False`` is the CPU EP's segments alone (what
    ``llmc verify`` compares tensor by tensor). Raises RuntimeError or EngineError when the
    provider cannot run here (the message says why)."""
    if provider is not None and provider.name == OPENVINO_RUNTIME:
        from llmc.runtime.runners.openvino_runner import OpenVinoRunner

        if single_graph:
            raise RuntimeError(f"cannot run {engine_dir} as one graph on {OPENVINO_RUNTIME}")
        return OpenVinoRunner(engine_dir, num_blocks, threads or 2, provider.precision)
    if provider is not None and provider.name == HYBRID:
        if single_graph is False:  # the CPU EP's segments, as the hybrid's small steps run
            return OrtRunner(engine_dir, num_blocks, threads, provider_for_dtype("float32"), False)
        from llmc.runtime.runners.hybrid_runner import MIN_OPENVINO_TOKENS, HybridRunner

        min_tokens = provider.min_large_tokens or MIN_OPENVINO_TOKENS
        return HybridRunner(engine_dir, num_blocks, threads or 2, provider.precision, min_tokens)
    return OrtRunner(engine_dir, num_blocks, threads, provider, single_graph)
