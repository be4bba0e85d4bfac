"""OpenVINO's runtime on an engine's segments (``OpenVinoRunner``) against ONNX Runtime's
runner on the same engine: the same logits and KV cache to float32 rounding at f32 compute,
within bf16 error at bf16, over a prefill and a mixed prefill-and-decode step."""

from __future__ import annotations

import numpy as np
import pytest

from llmc.engine.provider import OPENVINO_RUNTIME, ProviderChoice
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.openvino_runner import OpenVinoRunner, openvino_available
from llmc.runtime.runners.ort_runner import OrtRunner
from llmc.runtime.runners.step_inputs import StepInputs

pytestmark = pytest.mark.skipif(openvino_available() is not None, reason=str(openvino_available()))
BLOCK = 16  # the tiny_llama_engine fixture's block size


def steps() -> list[StepInputs]:
    """Sequence A: a 20-token prefill (blocks 0, 1); then A's decode at position 20 beside
    sequence B's 5-token prefill (block 2), logits for both."""
    a = np.arange(3, 23, dtype=np.int64)
    prefill = StepInputs(
        input_ids=a,
        positions=np.arange(20, dtype=np.int64),
        seq_lens=np.array([20], np.int32),
        query_start_loc=np.array([0, 20], np.int32),
        block_tables=np.array([[0, 1]], np.int32),
        slot_mapping=np.arange(20, dtype=np.int64),
        logits_indices=np.array([19], np.int64),
    )
    mixed = StepInputs(
        input_ids=np.array([41, 7, 8, 9, 10, 11], np.int64),
        positions=np.array([20, 0, 1, 2, 3, 4], np.int64),
        seq_lens=np.array([21, 5], np.int32),
        query_start_loc=np.array([0, 1, 6], np.int32),
        block_tables=np.array([[0, 1], [2, 0]], np.int32),
        slot_mapping=np.array([20, 32, 33, 34, 35, 36], np.int64),
        logits_indices=np.array([0, 5], np.int64),
    )
    return [prefill, mixed]


@pytest.mark.parametrize("precision, tolerance", [("f32", 1e-4), ("bf16", 0.15)])
def test_openvino_runner_matches_onnx_runtime(tiny_llama_engine, precision, tolerance):
    reference = OrtRunner(tiny_llama_engine, num_blocks=4, single_graph=False)
    runner = cpu_runner(tiny_llama_engine, 4, provider=ProviderChoice(OPENVINO_RUNTIME, precision))
    assert isinstance(runner, OpenVinoRunner) and not runner.single_graph
    assert runner.vocab_size == reference.vocab_size
    for step in steps():
        want, got = reference.execute(step), runner.execute(step)
        assert got.shape == want.shape == (len(step.logits_indices), reference.vocab_size)
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert rel <= tolerance
        if precision == "bf16":
            assert rel > 0  # bf16 really ran
        for name, cache in reference.kv_caches.items():
            scale = np.abs(cache).max()
            assert scale > 0 and np.abs(runner.kv_caches[name] - cache).max() <= tolerance * scale


def test_logits_are_the_callers_after_the_next_step(tiny_llama_engine):
    """OpenVINO reuses its output buffers; the logits a step returned must not change."""
    runner = cpu_runner(tiny_llama_engine, 4, provider=ProviderChoice(OPENVINO_RUNTIME, "f32"))
    first, second = steps()
    logits = runner.execute(first)
    kept = logits.copy()
    runner.execute(second)
    np.testing.assert_array_equal(logits, kept)


def test_onnx_runtime_cannot_be_bound_to_openvinos_runtime(tiny_llama_engine):
    from llmc.errors import EngineError

    with pytest.raises(EngineError, match="not an ONNX Runtime execution provider"):
        OrtRunner(tiny_llama_engine, 4, provider=ProviderChoice(OPENVINO_RUNTIME, "f32"))
