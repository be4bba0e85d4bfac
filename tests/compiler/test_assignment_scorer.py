"""The accuracy-target scorer on a tiny Gemma 3 (real ONNX Runtime, real attention kernel): a
scoring that starts past the float segments (``resumable``), or that reuses a screening's
windows, gives the whole run's report."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from llmc.calibration.accuracy import pooled_report
from llmc.compiler.frontend.model_source import load_model, resolve_model
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.search.assignment_eval import AssignmentScorer
from llmc.compiler.stages.export import float_graph
from llmc.quant.protocol import QuantSpec
from tests.tiny_models import make_tiny_gemma3

W8 = "int8_weight_only"


def test_a_resumed_scoring_equals_the_whole_run(tmp_path):
    ckpt = make_tiny_gemma3(tmp_path / "ckpt", seed=2)
    proto, _ = float_graph(load_model(resolve_model(str(ckpt)), "float32"), 16)
    spec = QuantSpec(quant="int8", weight_only8_block_size=32)
    targets = find_targets(ir.from_proto(proto))
    modules = [t.module for t in targets if t.module.startswith("model.layers.1.")]
    precomputed = {
        (t.module, W8): FORMATS[W8].quantize(t.weight(), None, spec)
        for t in targets
        if t.module in modules
    }
    rng = np.random.default_rng(0)
    sets = {"s": [rng.integers(3, 500, 40) for _ in range(3)]}
    assignment = tuple((m, W8) for m in modules)

    def scorer(resumable):
        return AssignmentScorer(proto, precomputed, sets, {"s": "x"}, 1, resumable=resumable)

    with scorer(()) as whole, scorer(("s",)) as resumed:
        want, got = whole.score(assignment, "s"), resumed.score(assignment, "s")
        start = resumed._start(assignment, "s")
        assert start is not None and start.segment == 1  # layer 1's q/k/v open segment 1
        assert resumed._start((), "s").segment == resumed._runner().num_segments - 1
        # A screening's windows are not run again: screened + the rest = the whole scoring.
        part = resumed.screen(assignment, "s", 2)
        runs = resumed.runs
        assert [r.num_windows for r in part] == [1, 1] and resumed.score(assignment, "s") == want
        assert resumed.runs == runs + 1
        # A longer screening runs only the windows past the shorter one's.
        other = tuple((m, W8) for m in modules[:1])
        two = resumed.screen(other, "s", 2)
        runs = resumed.runs
        three = resumed.screen(other, "s", 3)
        assert three[:2] == two and len(three) == 3 and resumed.runs == runs + 1
        assert resumed.score(other, "s") == pooled_report(three, "x") and resumed.runs == runs + 1
    assert got == want and got.mean_kl > 0
    assert pooled_report(part, "x").num_tokens == 2 * 39


def test_scorings_run_as_streams_equal_each_alone(tmp_path, monkeypatch):
    """``score_each`` gives each assignment's own ``score`` while making one session per
    segment and variant: one-module assignments share their float segments."""
    from llmc.runtime.runners.layerwise_runner import LayerwiseRunner

    ckpt = make_tiny_gemma3(tmp_path / "ckpt", seed=3)
    proto, _ = float_graph(load_model(resolve_model(str(ckpt)), "float32"), 16)
    spec = QuantSpec(quant="int8", weight_only8_block_size=32)
    targets = find_targets(ir.from_proto(proto))
    modules = [t.module for t in targets if t.module.endswith(("q_proj", "down_proj"))]
    precomputed = {(t.module, W8): FORMATS[W8].quantize(t.weight(), None, spec) for t in targets}
    rng = np.random.default_rng(1)
    sets = {"s": [rng.integers(3, 500, 33) for _ in range(2)]}
    each = [((m, W8),) for m in modules] + [tuple((m, W8) for m in modules)]
    made = []
    session = LayerwiseRunner._session
    monkeypatch.setattr(
        LayerwiseRunner, "_session", lambda *a, **k: made.append(a[2]) or session(*a, **k)
    )
    with AssignmentScorer(proto, precomputed, sets, {"s": "x"}, 1, resumable=("s",)) as scorer:
        scorer.score((), "s")  # the reference and the float entries: made before counting
        made.clear()
        alone = [scorer.score(a, "s") for a in each]
        sessions_alone = len(made)
        made.clear()
        together = scorer.score_each(each, "s")
        segment_of = scorer._segments_of_modules()
        num_segments = scorer._runner().num_segments
    assert together == alone and len({r.mean_kl for r in alone}) == len(each)
    # One session per segment and variant among the streams started there: a stream starts at
    # its first quantized segment; its variant of a segment is its modules quantized in it.
    variants = 0
    for i in range(num_segments):
        started = [a for a in each if min(segment_of[m] for m, _ in a) <= i]
        variants += len({tuple(sorted(m for m, _ in a if segment_of[m] == i)) for a in started})
    assert len(made) == variants < sessions_alone
