"""The quantize stage's scorings on held-out text before the engine is lowered: the
``--accuracy-target`` search (``targeted``) and the accuracy anchor (``anchors``), sharing one
``AssignmentScorer`` so the float graph's held-out logits are computed once."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmc.compiler.quantize.search.assignment_eval import AssignmentScorer


@dataclass(frozen=True)
class ScoringGraph:
    """The float graph the scorings run and how they run it, as ``AssignmentScorer`` takes it.

    Attributes:
        float_model: the float engine graph (``onnx.ModelProto``).
        weights_dir: where its external data is (None: weights in the proto).
        prepare: its segments' own preparation (widening 16-bit stored weights) or None.
        session_config: the engine's ONNX Runtime session entries.
        attention_fpmath: the engine's attention ``fpmath_mode``.
        block_int8: 8-bit weight-only modules on ``llmc::BlockInt8MatMul``, as the engine.
    """

    float_model: Any
    weights_dir: Path | None
    prepare: Callable | None
    session_config: dict[str, str]
    attention_fpmath: str
    block_int8: bool


def score_heldout(config, targeted, anchors, texts, graph: ScoringGraph, progress, resume=None):
    """(the search's ``SearchResult`` or None, the anchor's manifest record or None).

    ``targeted``: a ``TargetedQuantization`` or None; ``anchors``: an ``AnchorQuantization``
    or None; ``texts``: (calibration source, held-out source, ``load(source, num)`` giving
    ``num`` windows of a source, the calibration windows already loaded or []);
    ``graph``: what the scorings run. The
    sensitivities are scored on the first calibration windows (sampled anew when the statistics
    came from the cache), everything else on the held-out windows of the accuracy report.
    ``progress(done, total)`` counts scorings; ``resume`` (a ``path_search.Resume``) resumes
    the search past an engine that missed the target, without its sensitivity scorings.
    Raises AccuracyTargetError as ``search.search``."""
    from llmc.compiler.quantize.search.targeted import SENSITIVITY_STRIDE, SENSITIVITY_WINDOWS

    calib_source, heldout_source, load, windows = texts
    calib = config.calibration
    sets = {"heldout": load(heldout_source, calib.eval_samples)}
    labels = {"heldout": heldout_source.describe(), "sensitivity": calib_source.describe()}
    precomputed = {}
    if anchors is not None:
        anchors.finish()
        precomputed.update(anchors.precomputed)
    if targeted is not None:
        targeted.finish()
        precomputed.update(targeted.precomputed)
        sets["sensitivity"] = windows[:SENSITIVITY_WINDOWS] or load(
            calib_source, min(SENSITIVITY_WINDOWS, calib.calib_samples)
        )
    scorer = AssignmentScorer(
        graph.float_model, precomputed, sets, labels, config.target.threads, graph.weights_dir,
        graph.prepare, graph.session_config, {"sensitivity": SENSITIVITY_STRIDE},
        graph.attention_fpmath, ("sensitivity",), graph.block_int8,
    )  # fmt: skip
    done, total = itertools.count(1), _scorings(targeted, resume) + (anchors is not None)
    tick = lambda _=None: progress(next(done), total)  # noqa: E731
    with scorer:
        result = anchor = None
        if targeted is not None:
            result = targeted.search(config.quantization.target, scorer, tick, resume)
        if anchors is not None:
            anchor = anchors.record(scorer.score(anchors.assignment(), "heldout"))
            tick()
    return result, anchor


def _scorings(targeted, resume) -> int:
    """About how many scorings the search makes: the flat one, the sensitivities (none when
    resumed), then about log2(moves) + 1 on the path."""
    if targeted is None:
        return 0
    sensitivities = sum(len(u.ladder) - 1 for u in targeted.units)
    path = 2 + math.ceil(math.log2(sensitivities + 1))
    return path + (sensitivities if resume is None else 0)
