"""The hybrid runner (``HybridRunner``): small steps on ONNX Runtime's single graph, large ones
on OpenVINO's runtime over the same KV cache; the same logits and caches as ONNX Runtime's
runner alone to float32 rounding, and each step on the runtime its size picks."""

from __future__ import annotations

import numpy as np
import pytest

from llmc.engine.provider import HYBRID, ProviderChoice
from llmc.runtime.runners import openvino_runner
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.hybrid_runner import HybridRunner
from llmc.runtime.runners.openvino_runner import openvino_available
from llmc.runtime.runners.ort_runner import OrtRunner
from tests.runtime.test_openvino_runner import steps

pytestmark = pytest.mark.skipif(openvino_available() is not None, reason=str(openvino_available()))


@pytest.fixture
def openvino_calls(monkeypatch) -> list[int]:
    """One entry per OpenVINO segment inference."""
    calls: list[int] = []
    real = openvino_runner._Segment.run
    monkeypatch.setattr(
        openvino_runner._Segment, "run", lambda self, *a: calls.append(1) or real(self, *a)
    )
    return calls


def test_large_steps_run_on_openvino_and_small_ones_on_onnx_runtime(
    tiny_llama_engine, openvino_calls
):
    reference = OrtRunner(tiny_llama_engine, num_blocks=4)
    runner = cpu_runner(tiny_llama_engine, 4, provider=ProviderChoice(HYBRID, "f32"))
    assert isinstance(runner, HybridRunner) and runner.single_graph and runner.min_tokens == 8
    prefill, mixed = steps()  # 20 new tokens, then 6 (A's decode beside B's 5-token prefill)
    segments = len(runner.plan.segments)
    for step, calls in ((prefill, segments), (mixed, segments)):
        want, got = reference.execute(step), runner.execute(step)
        assert len(openvino_calls) == calls  # the 20-token step on OpenVINO, the 6-token one not
        assert got.shape == want.shape == (len(step.logits_indices), reference.vocab_size)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        for name, cache in reference.kv_caches.items():
            scale = np.abs(cache).max()
            assert scale > 0 and np.abs(runner.kv_caches[name] - cache).max() <= 1e-4 * scale


def test_min_tokens_moves_the_boundary(tiny_llama_engine, openvino_calls):
    runner = HybridRunner(tiny_llama_engine, 4, min_tokens=1)
    reference = OrtRunner(tiny_llama_engine, num_blocks=4)
    for step in steps():
        want, got = reference.execute(step), runner.execute(step)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert len(openvino_calls) == 2 * len(runner.plan.segments)  # both steps on OpenVINO


def test_bad_arguments_are_refused(tiny_llama_engine):
    with pytest.raises(ValueError, match="min_tokens must be at least 1"):
        HybridRunner(tiny_llama_engine, 4, min_tokens=0)
    with pytest.raises(ValueError, match="precision 'f16' is not one of"):
        HybridRunner(tiny_llama_engine, 4, precision="f16")
    # Without the single graph it is the CPU EP's segments (``llmc verify`` reads their tensors).
    segments = cpu_runner(tiny_llama_engine, 4, provider=ProviderChoice(HYBRID, "f32"),
                          single_graph=False)  # fmt: skip
    assert type(segments) is OrtRunner and not segments.single_graph


def test_the_manifest_records_the_boundary(tiny_llama_engine, openvino_calls):
    # A manifest's ``execution_min_large_tokens`` is the boundary the runner uses.
    runner = cpu_runner(tiny_llama_engine, 4, provider=ProviderChoice(HYBRID, "f32", 32))
    assert runner.min_tokens == 32
    runner.execute(steps()[0])  # 20 new tokens: below 32, on ONNX Runtime
    assert openvino_calls == []
