"""The quantization pipeline of ``llmc build``: calibration (cached), the ``--accuracy-target``
search and the anchor, Q/DQ rewrite, one segment at a time; the text it reads is ``texts``'."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir

from llmc.calibration.data import TextSampler
from llmc.calibration.stats_cache import StatsCache, as_stored, build_reserve
from llmc.compiler.frontend.streamed_export import load_float_graph
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.front import family_of
from llmc.compiler.quantize.qdq import GraphQuantizer, QuantReport, calibration_tensors, gptq_keys
from llmc.compiler.quantize.search.heldout_scoring import ScoringGraph
from llmc.compiler.quantize.tensor_spill import TensorSpill
from llmc.compiler.quantize.texts import TextSource, windows_of
from llmc.compiler.weights.stored_weights import segment_widener
from llmc.engine.isa import detect_host_isa
from llmc.engine.plugin import engine_attention_fpmath
from llmc.heap import release_freed_memory
from llmc.plugins.int8_matmul import block_int8_matmul_isa

if TYPE_CHECKING:
    from llmc.compiler.config.build_config import BuildConfig

#: The quantized graph of a streamed build, written in its work directory.
QUANTIZED_GRAPH = "quantized.onnx"
#: Its quantized weights as they are made, before the graph is written (``TensorSpill``).
QUANTIZED_SPILL = "quantized.spill"
#: Where a streamed build's search and anchor weights are written as they are made
#: (``targeted``, ``anchors``).
SEARCH_SPILL_DIR = "search.spill"


def quantize(
    config: BuildConfig,
    float_model: onnx.ModelProto,
    hf_model,
    tokenizer,
    checkpoint_digest: str,
    calib_source: TextSource,
    stage,
    bound_pairs: bool = False,
    weights_dir: Path | None = None,
    work_dir: Path | None = None,
    heldout_source: TextSource | None = None,
    gguf_types=None,
    resume=None,
) -> tuple[onnx.ModelProto, QuantReport]:
    """Calibrate (or read cached statistics) and quantize one segment at a time; return the Q/DQ
    graph and its report. ``bound_pairs``: int8 weight pairs within 128 (CPU hosts without
    VNNI, see ``formats``).

    Calibration runs the float graph one segment at a time over every window
    (``LayerwiseRunner``); a finished segment's modules are quantized and their statistics
    (GPTQ's Gram matrices included) cached and dropped, so memory holds one segment's weights
    and statistics and the windows' activations. A streamed float graph (``float_model``
    referencing ``weights_dir / FLOAT_GRAPH.data``) is read from disk, its quantized weights
    go to disk as they are made and the graph is written to ``work_dir``; the returned proto
    then references them. ``hf_model`` only samples calibration text (no ``--calib-data``).

    With ``--accuracy-target``, every module is quantized in each format of its ladder while
    its statistics are in memory, the assignment is searched on held-out windows of
    ``heldout_source`` (``targeted``) and the graph written with the one chosen, recorded in
    ``spec["accuracy_target"]``. With ``--anchor auto`` the anchor (``anchors``: llama.cpp's
    Q8_0 for a GGUF checkpoint, whose stored types are ``gguf_types``, else round-to-nearest)
    is scored on the same windows and recorded in ``spec["anchor"]``. ``resume`` (a
    ``path_search.Resume``) resumes the search past an engine that missed the target."""
    if weights_dir is not None and work_dir is None:
        raise ValueError("a streamed graph is quantized into a work directory")
    spec = config.quant_spec(bound_pairs)
    calib = config.calibration
    graph = load_float_graph(weights_dir) if weights_dir else ir.from_proto(float_model)
    tensors = calibration_tensors(graph, spec)
    gram_keys = gptq_keys(graph, spec)
    sampler = None if calib_source.path else _sampler_kind(hf_model)
    key = _calibration_key(config, checkpoint_digest, calib_source, sampler, tensors, gram_keys)
    cache = StatsCache(calib.stats_path(key), build_reserve(_weight_bytes(graph)))
    # A streamed build's quantized weights go to disk as they are made (``TensorSpill``).
    spill = TensorSpill(work_dir / QUANTIZED_SPILL) if weights_dir is not None else None
    streamed_work = work_dir if weights_dir is not None else None
    targeted, anchors, search_dir = _searches(config, graph, spec, streamed_work, gguf_types)
    if (targeted or anchors) and heldout_source is None:
        raise ValueError("--accuracy-target and the accuracy anchor need held-out text")
    quantizer = GraphQuantizer(graph, spec, spill)
    cached = bool(tensors) and cache.is_complete()
    windows: list = []
    if tensors and not cached:
        with stage("calibration data"):
            num, seq_len = calib.calib_samples, calib.calib_seq_len
            windows = windows_of(calib_source, hf_model, tokenizer, num, seq_len)
    with stage(_calibration_title(spec.quant, cached, tensors, windows, calib)) as tick:
        if cached or not tensors:
            parts = cache.segments() if cached else ()
        else:
            runner = _layerwise_runner(config, float_model, tensors, weights_dir)
            parts = _calibrate(runner, tensors, windows, gram_keys, cache, tick)
        report = _quantize_segments(parts, quantizer, targeted, anchors)
    if targeted is not None or anchors is not None:
        texts = (calib_source, heldout_source, hf_model, tokenizer, windows)
        graph_run = ScoringGraph(
            float_model,
            weights_dir,
            segment_widener(weights_dir),
            session_config(spec.quant),
            scoring_fpmath(config, spec.quant),
            scoring_block_int8(config, spec.quant),
        )
        searches = (targeted, anchors, report)
        report = _score_heldout(config, graph, spill, searches, texts, graph_run, stage, resume)
        del targeted, anchors, quantizer  # the weights of the formats and anchors not chosen
        if search_dir is not None:
            shutil.rmtree(search_dir)
        release_freed_memory()
    used = _cache_use(bool(tensors), cached, cache)
    report.spec["calibration"] = _calibration_record(calib_source, calib, key, used)
    return _written(graph, report, work_dir if weights_dir is not None else None, spill, stage)


def _calibration_record(calib_source: TextSource, calib, key: str, cache_use) -> dict:
    """The report's ``spec["calibration"]``: the text, its size, the cache key and use."""
    return {
        "data": calib_source.describe(),
        "samples": calib.calib_samples,
        "seq_len": calib.calib_seq_len,
        "cache_key": key,
        "cache": cache_use,
    }


def _written(graph, report: QuantReport, streamed_work: Path | None, spill, stage):
    """(proto, report) of the quantized ``graph``: in memory, or for a streamed build saved
    into ``streamed_work`` with its weights as external data (the spilled tensors copied in)
    and returned as references to them."""
    if streamed_work is None:
        return ir.to_proto(graph), report
    with stage("write the quantized graph"), spill:
        path = streamed_work / QUANTIZED_GRAPH
        ir.save(graph, path, external_data=QUANTIZED_GRAPH + ".data", max_in_flight_bytes=256 << 20)
        spill.path.unlink()  # copied into the graph's external data
        return onnx.load(str(path), load_external_data=False), report


def _sampler_kind(hf_model) -> str:
    """What samples the calibration text: a ``TextSampler``'s kind, or a transformers model's
    class."""
    return hf_model.kind if isinstance(hf_model, TextSampler) else type(hf_model).__name__


def _weight_bytes(model: ir.Model) -> int:
    """The bytes of ``model``'s initializers (from their shapes: external data is not read)."""
    return sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )


def _calibration_key(config, checkpoint_digest, calib_source, sampler, tensors, gram_keys) -> str:
    """The statistics cache's key: what the statistics depend on (``calibration_key``).
    ``sampler``: the class that samples calibration text (None: a file gives it)."""
    from llmc.calibration.collect import calibration_key
    from llmc.version import __version__

    calib = config.calibration
    return calibration_key(
        model=checkpoint_digest,
        data=calib_source.digest(),
        # Sampled text depends on what samples it (transformers or llmc's runtime).
        sampler=sampler,
        samples=calib.calib_samples,
        seq_len=calib.calib_seq_len,
        method=config.calib_method,
        tensors=sorted(tensors),
        gram=sorted(gram_keys),
        llmc=__version__,
    )


def _searches(config, graph, spec, streamed_work: Path | None, gguf_types):
    """(targeted, anchors, search_dir): the ``--accuracy-target`` search's per-format
    quantization and the accuracy anchor's (None when not asked for); a streamed build writes
    their weights under ``streamed_work`` (``search_dir``, else None)."""
    target, anchor = config.quantization.target is not None, config.calibration.anchor == "auto"
    search_dir = None
    if streamed_work is not None and (target or anchor):
        search_dir = streamed_work / SEARCH_SPILL_DIR
        search_dir.mkdir(exist_ok=True)
    targeted = anchors = None
    if target:
        from llmc.compiler.quantize.search.targeted import TargetedQuantization

        arch, dtype = config.target.arch, str(config.source.dtype)
        targeted = TargetedQuantization(graph, spec, arch, dtype, search_dir)
    if anchor:
        from llmc.compiler.quantize.anchors import AnchorQuantization

        anchors = AnchorQuantization(graph, spec, gguf_types, search_dir)
    return targeted, anchors, search_dir


def _calibration_title(quant: str, cached: bool, tensors, windows: list, calib) -> str:
    """The progress title of the calibrate-and-quantize stage."""
    if cached or not tensors:
        return f"quantize ({quant}, {'cached statistics' if cached else 'no calibration'})"
    return f"calibrate and quantize ({quant}, {len(windows)} x {calib.calib_seq_len} tokens)"


def _layerwise_runner(config, float_model, tensors, weights_dir):
    """The ``LayerwiseRunner`` that calibrates ``float_model`` one segment at a time, with
    the calibrated ``tensors`` as extra outputs."""
    from llmc.runtime.runners.layerwise_runner import LayerwiseRunner

    return LayerwiseRunner(
        float_model,
        threads=config.target.threads,
        extra_outputs=tuple(dict.fromkeys(tensors.values())),
        external_data_dir=weights_dir,
        logits=False,
        prepare=segment_widener(weights_dir),
    )


def _quantize_segments(parts, quantizer, targeted, anchors) -> QuantReport | None:
    """Feed each segment's statistics to the anchors and to the quantizer (or to the targeted
    search, which quantizes after scoring); returns the quantizer's report, None when the
    search decides."""
    for _, stats in parts:
        if anchors is not None:
            anchors.add(stats)
        if targeted is None:
            quantizer.quantize(stats)
        else:
            targeted.add(stats)
        del stats
        release_freed_memory()  # the segment's statistics and quantization temporaries
    return quantizer.finish() if targeted is None else None


def _score_heldout(
    config, graph, spill, searches, texts, graph_run, stage, resume=None
) -> QuantReport:
    """Score the search's candidates and the anchor on the held-out windows, then quantize
    with the assignment found; returns the report (the search's, else the flat one) with the
    search and the anchor recorded in its spec. ``searches``: (targeted, anchors, the flat
    quantization's report or None); ``texts``: (calibration source, held-out source, sampler
    model, tokenizer, calibration windows)."""
    from llmc.compiler.quantize.search.heldout_scoring import score_heldout

    calib_source, heldout_source, hf_model, tokenizer, windows = texts
    seq_len = config.calibration.calib_seq_len

    def load(source: TextSource, num: int) -> list[np.ndarray]:
        return windows_of(source, hf_model, tokenizer, num, seq_len)

    targeted, anchors, report = searches
    target = config.quantization.target
    scoring = (calib_source, heldout_source, load, windows)
    with stage(_scoring_title(target, anchors)) as tick:
        result, anchor = score_heldout(config, targeted, anchors, scoring, graph_run, tick, resume)
        if result is not None:
            quantizer = GraphQuantizer(
                graph, targeted.spec_for(result), spill, targeted.precomputed
            )
            quantizer.quantize(targeted.kv_stats)
            report = quantizer.finish()
            report.spec["accuracy_target"] = result.to_dict()
        if anchor is not None:
            report.spec["anchor"] = anchor
    return report


def _scoring_title(target, anchors) -> str:
    parts = ([f"accuracy target search ({target})"] if target is not None else []) + (
        [f"accuracy anchor ({anchors.name})"] if anchors is not None else []
    )
    return ", ".join(parts)


def _calibrate(runner, tensors, windows, gram_keys, cache, progress):
    """(segment, statistics) of each calibrated segment of ``runner`` (a ``LayerwiseRunner``),
    as the cache stores them (``as_stored``: a build that reads them quantizes the same), saved
    to ``cache`` as they come; the cache is marked complete after the last."""
    from llmc.calibration.collect import collect_by_segment

    parts = collect_by_segment(runner, tensors, windows, progress, gram_keys=gram_keys)
    for segment, collected in parts:
        stats = as_stored(collected)
        del collected
        cache.save(segment, stats)
        yield segment, stats
        del stats  # not held while the next segment runs
    cache.mark_complete()


def _cache_use(calibrated: bool, cached: bool, cache) -> str:
    """Where the statistics came from or went: "read", "saved", why they were not saved
    (``StatsCache.skipped``), or "none" (nothing calibrated)."""
    if not calibrated:
        return "none"
    return "read" if cached else cache.skipped or "saved"


def scoring_block_int8(config, quant: str) -> bool:
    """Whether held-out scorings run 8-bit weight-only modules on ``llmc::BlockInt8MatMul``:
    where a cpu engine of ``quant`` built on this host does (``host.plan_cpu``)."""
    if family_of(config.target.arch) != "cpu" or quant == "none":
        return False
    return block_int8_matmul_isa(detect_host_isa().features) is not None


def scoring_fpmath(config, quant: str) -> str:
    """The attention ``fpmath_mode`` held-out scorings run with: a cpu engine's own
    (``engine_attention_fpmath``); "strict" for a GPU target, whose kernels this host does not
    run."""
    if family_of(config.target.arch) != "cpu":
        return "strict"
    return engine_attention_fpmath(quant, str(config.source.dtype))


def session_config(quant: str) -> dict[str, str]:
    """ORT session config entries the lowering of a ``quant`` engine needs (its format's)."""
    return dict(FORMATS[quant].ort_session_config)


def rewrite_for_cpu(model: onnx.ModelProto, counts: dict[str, int]) -> dict[str, int]:
    """The CPU rewrite of every format that quantized modules (``counts``, by report label,
    ``QuantReport.counts``), in place; returns the rewrites by format."""
    return {f.name: f.rewrite_for_cpu(model) for f in FORMATS.values() if counts.get(f.label)}
