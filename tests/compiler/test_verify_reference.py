"""``llmc verify``'s reference, written from the checkpoint and run one segment at a time, gives
the tensors the whole unquantized graph gives: every window's logits in its spill file, and the
first window's step inputs, boundary tensors and logits that the segment comparison reads."""

from __future__ import annotations

import tempfile

import numpy as np

from llmc.compiler.frontend.model_source import resolve_model, sha256_files
from llmc.compiler.stages.progress import no_stage
from llmc.compiler.verify.reference_run import reference_graph, reference_runner, run_reference
from llmc.runtime.runners.ort_runner import OrtRunner
from llmc.runtime.runners.step_inputs import single_prefill
from tests.tiny_models import make_tiny_gemma3

BLOCK = 4


def test_one_segment_at_a_time_gives_the_whole_graphs_tensors(tmp_path):
    src = resolve_model(str(make_tiny_gemma3(tmp_path / "ckpt", seed=3)))
    graph = reference_graph(src, sha256_files(src.weight_files), BLOCK, tmp_path, no_stage)
    rng = np.random.default_rng(0)
    windows = [rng.integers(3, 500, n).astype(np.int64) for n in (24, 17, 9)]
    plain = reference_runner(graph, 1, ())
    every_boundary = {n for s in plain.plan.segments for n in (*s.inputs, *s.outputs)}
    computed = {o for node in graph.proto.graph.node for o in node.output}
    boundaries = tuple(sorted(every_boundary & computed))
    runner = reference_runner(graph, 1, boundaries)
    with tempfile.TemporaryFile() as spill:
        shapes, first = run_reference(runner, windows, spill)
        spill.seek(0)
        spilled = np.fromfile(spill, np.float32)

    whole = OrtRunner.from_model(
        graph.proto, 6, 1, extra_outputs=boundaries, external_data_dir=graph.weights_dir
    )
    offset = 0
    for i, window in enumerate(windows):
        env = whole.run_step(single_prefill(window, BLOCK))
        logits = env[whole.plan.logits]
        assert shapes[i] == logits.shape
        got = spilled[offset : offset + logits.size].reshape(logits.shape)
        np.testing.assert_allclose(got, logits, rtol=1e-5, atol=1e-6)
        offset += logits.size
        if i == 0:  # what the segment comparison reads: every engine segment's inputs, outputs
            assert every_boundary <= set(first)
            for name in every_boundary:
                np.testing.assert_allclose(first[name], env[name], rtol=1e-5, atol=1e-6)
    assert offset == spilled.size
