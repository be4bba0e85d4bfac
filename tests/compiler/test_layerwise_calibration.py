"""Calibration and quantization one segment at a time give what running the whole graph per
window gives: the same logits, the same statistics (Gram matrices and reservoir samples
included), the same quantized weights and scales (real ONNX Runtime, real attention kernel)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from llmc.calibration.collect import collect_by_segment, collect_stats
from llmc.calibration.stats_cache import StatsCache, build_reserve
from llmc.compiler.backends.onnxruntime.lower import set_fpmath_mode
from llmc.compiler.frontend.model_source import load_model, load_tokenizer, resolve_model
from llmc.compiler.quantize.qdq import (
    GraphQuantizer,
    QuantSpec,
    calibration_tensors,
    gptq_keys,
    is_kv_key,
    quantize_graph,
)
from llmc.compiler.stages.export import float_graph
from llmc.plugins.paged_attention.cpu import bf16_prefill_available
from llmc.runtime.runners.layerwise_runner import LayerwiseRunner
from llmc.runtime.runners.ort_runner import OrtRunner
from llmc.runtime.runners.step_inputs import single_prefill
from tests.tiny_models import make_tiny_gemma3

BLOCK = 16
SEQ = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(float engine graph, windows of unequal lengths) of a tiny Gemma 3."""
    ckpt = make_tiny_gemma3(tmp_path_factory.mktemp("gemma") / "ckpt", seed=5)
    proto, _ = float_graph(load_model(resolve_model(str(ckpt)), "float32"), BLOCK)
    rng = np.random.default_rng(1)
    windows = [rng.integers(3, 512, n) for n in (SEQ, SEQ - 5, 17, SEQ)]
    return proto, windows


def test_layerwise_logits_equal_whole_graph(tiny):
    proto, windows = tiny
    runner = LayerwiseRunner(proto)
    whole = OrtRunner.from_model(proto, -(-SEQ // BLOCK))
    got = {
        out.window: out.tensors[runner.logits]
        for out in runner.run(windows)
        if out.segment == runner.num_segments - 1 and out.window is not None
    }
    assert sorted(got) == list(range(len(windows)))
    for i, window in enumerate(windows):
        want = whole.execute(single_prefill(window, BLOCK, all_logits=True))
        assert got[i].shape == (len(window), whole.vocab_size)
        np.testing.assert_array_equal(got[i], want)


def test_chunked_prefill_steps_give_the_single_prefill_logits(tiny):
    """``prefill_chunks``: the steps, run in order on one runner (each reading the earlier
    chunks' keys and values from its cache), give a window's logits row for row as one prefill
    step does, to float32 rounding; a chunk of 0 is refused."""
    from llmc.runtime.runners.step_inputs import prefill_chunks

    proto, windows = tiny
    runner = OrtRunner.from_model(proto, -(-SEQ // BLOCK))
    for window in windows[:3]:
        steps = list(prefill_chunks(window, BLOCK, 7))
        assert [s.num_tokens for s in steps][:-1] == [7] * (len(steps) - 1)
        got = np.concatenate([runner.execute(step) for step in steps])
        want = runner.execute(single_prefill(window, BLOCK, all_logits=True))
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)  # MatMul blocks by rows
    with pytest.raises(ValueError, match="chunk"):
        next(prefill_chunks(windows[0], BLOCK, 0))


def test_a_window_s_logits_are_released_before_the_next_window_runs(tiny):
    """The runner holds no window's logits once the consumer dropped them: a logits chunk per
    window held to the end of the last segment was 16 x 67 MB at Gemma 3's vocabulary."""
    import weakref

    proto, windows = tiny
    runner = LayerwiseRunner(proto, logits_rows=16)
    last, previous, seen = runner.num_segments - 1, None, 0
    for out in runner.run(windows):
        if out.segment != last or out.window is None:
            continue
        assert previous is None or previous() is None, "an earlier chunk's logits are alive"
        previous = weakref.ref(out.tensors[runner.logits])
        seen += 1
        del out
    assert seen == sum(-(-len(w) // 16) for w in windows)


@pytest.mark.parametrize("strided", [False, True])
def test_logits_in_chunks_of_rows_are_the_whole_logits(tiny, strided):
    """``logits_rows`` computes each window's logits a few positions per run of the last
    segment: the chunks, in order, are the one-run logits (to float32 rounding: ONNX Runtime's
    MatMul blocks its work by the number of rows)."""
    proto, windows = tiny
    positions = [np.arange(0, len(w) - 1, 3) for w in windows] if strided else None
    probe = LayerwiseRunner(proto)
    last, name = probe.num_segments - 1, probe.logits

    def records(rows):
        runner = LayerwiseRunner(proto, logits_rows=rows)
        return [
            o for o in runner.run(windows, logits_indices=positions)
            if o.segment == last and o.window is not None
        ]  # fmt: skip

    whole = {o.window: o.tensors[name] for o in records(None)}
    chunked = records(5)
    for i, window in enumerate(windows):
        mine = [o for o in chunked if o.window == i]
        want = len(window) if positions is None else len(positions[i])
        assert [o.rows.start for o in mine] == list(range(0, want, 5))
        got = np.concatenate([o.tensors[name] for o in mine])
        assert got.shape == whole[i].shape == (want, whole[i].shape[1])
        np.testing.assert_allclose(got, whole[i], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="at least 1"):
        LayerwiseRunner(proto, logits_rows=0)


def test_attention_fpmath_runs_the_float_graph_as_its_engine(tiny):
    """A run with ``attention_fpmath="bf16"`` computes what the graph whose attention nodes carry
    ``fpmath_mode=bf16`` (a quantized cpu engine's) computes, bit for bit; on a host with
    AMX-BF16 prefill that differs from the strict run, elsewhere it is the strict run."""
    proto, windows = tiny
    runner = LayerwiseRunner(proto)
    engine_graph = onnx.ModelProto()
    engine_graph.CopyFrom(proto)
    assert set_fpmath_mode(engine_graph, "bf16") == 2
    engine = OrtRunner.from_model(engine_graph, -(-SEQ // BLOCK))

    def logits(mode: str | None) -> list[np.ndarray]:
        last = runner.num_segments - 1
        run = runner.run(windows, attention_fpmath=mode)
        return [o.tensors[runner.logits] for o in run if o.segment == last and o.window is not None]

    bf16, strict = logits("bf16"), logits(None)
    for window, got in zip(windows, bf16, strict=True):
        want = engine.execute(single_prefill(window, BLOCK, all_logits=True))
        np.testing.assert_array_equal(got, want)
    same = all(np.array_equal(a, b) for a, b in zip(bf16, strict, strict=True))
    assert same != bf16_prefill_available()
    with pytest.raises(ValueError, match="attention_fpmath must be one of"):
        next(runner.run(windows, attention_fpmath="fp16"))


def test_a_run_started_from_kept_entries_equals_a_whole_run(tiny):
    """A run that starts at segment k from the entries an earlier run kept computes, with any
    preparation of segments k and later, the logits of a whole run with it, bit for bit."""
    proto, windows = tiny
    runner = LayerwiseRunner(proto)
    k, last = 1, runner.num_segments - 1
    keep = dict.fromkeys(range(1, runner.num_segments))

    def scaled(segment, scratch: str):  # segments k.. with every matrix x 1.5: other logits
        if int(scratch.split("_")[1].split(".")[0]) < k:
            return segment
        segment = onnx.ModelProto.FromString(segment.SerializeToString())
        for init in segment.graph.initializer:
            if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2:
                scaled = numpy_helper.to_array(init) * 1.5
                init.CopyFrom(numpy_helper.from_array(scaled, init.name))
        return segment

    def logits(run) -> list[np.ndarray]:
        return [o.tensors[runner.logits] for o in run if o.segment == last and o.window is not None]

    plain = logits(runner.run(windows, keep=keep))
    assert all(keep[i].segment == i and len(keep[i].envs) == len(windows) for i in keep)
    want = logits(runner.run(windows, prepare=scaled))
    got = logits(runner.run(windows, prepare=scaled, start=keep[k]))
    for a, b, c in zip(got, want, plain, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
    with pytest.raises(ValueError, match="a start of 4 windows for 1"):
        next(runner.run(windows[:1], start=keep[k]))


def test_engine_kernels_give_the_same_logits_without_packed_weights(tiny):
    """A float graph run with the engine's kernels without ONNX Runtime's packed copies of its
    weights (the accuracy scorer's reference run) computes the same logits, bit for bit."""
    proto, windows = tiny
    runner = LayerwiseRunner(proto, engine_kernels=True)
    last = runner.num_segments - 1

    def logits(prepacking: bool) -> list[np.ndarray]:
        return [
            out.tensors[runner.logits]
            for out in runner.run(windows, prepacking=prepacking)
            if out.segment == last and out.window is not None
        ]

    for packed, unpacked in zip(logits(True), logits(False), strict=True):
        np.testing.assert_array_equal(unpacked, packed)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_statistics_by_segment_equal_all_at_once(tiny, quant):
    proto, windows = tiny
    spec = QuantSpec(quant=quant, weight_rounding="gptq", kv_cache_dtype="fp8")
    graph = ir.from_proto(proto)
    tensors = calibration_tensors(graph, spec)
    grams = gptq_keys(graph, spec)
    assert grams and any(is_kv_key(k) for k in tensors)
    whole = OrtRunner.from_model(proto, -(-SEQ // BLOCK), extra_outputs=tuple(tensors.values()))
    want = collect_stats(whole, tensors, windows, sample_rows=40, gram_keys=grams)

    runner = LayerwiseRunner(proto, extra_outputs=tuple(dict.fromkeys(tensors.values())))
    parts = list(collect_by_segment(runner, tensors, windows, sample_rows=40, gram_keys=grams))
    segments = [s for s, _ in parts]
    assert segments == sorted(set(segments)) and len(segments) > 1  # one part per segment
    got = {k: s for _, stats in parts for k, s in stats.items()}
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g = got[key]
        assert g.rows == w.rows == sum(len(x) for x in windows)
        np.testing.assert_array_equal(g.channel_absmax, w.channel_absmax)
        np.testing.assert_array_equal(g.channel_abssum, w.channel_abssum)
        np.testing.assert_array_equal(g.sample, w.sample)  # the reservoir drew the same rows
        assert (g.gram is None) == (w.gram is None) == (key not in grams)
        if g.gram is not None:
            np.testing.assert_array_equal(g.gram, w.gram)


def test_calibration_without_logits_skips_the_projection_and_keeps_the_statistics(tiny):
    proto, windows = tiny
    spec = QuantSpec(quant="int8", weight_rounding="gptq", kv_cache_dtype="fp8")
    graph = ir.from_proto(proto)
    tensors = calibration_tensors(graph, spec)
    grams = gptq_keys(graph, spec)
    names = tuple(dict.fromkeys(tensors.values()))
    full = LayerwiseRunner(proto, extra_outputs=names)
    lean = LayerwiseRunner(proto, extra_outputs=names, logits=False)
    vocab = OrtRunner.from_model(proto, -(-SEQ // BLOCK)).vocab_size

    def vocab_weights(runner):  # vocabulary-sized initializers of the last segment, as run
        segment, _, _ = runner.segment_to_run(runner.num_segments - 1)
        return [t.name for t in segment.graph.initializer if vocab in t.dims]

    assert vocab_weights(full) and not vocab_weights(lean)
    last = [o for o in lean.run(windows[:1]) if o.segment == lean.num_segments - 1]
    assert last and all(lean.logits not in o.tensors for o in last)

    def stats(runner):
        parts = collect_by_segment(runner, tensors, windows, sample_rows=40, gram_keys=grams)
        return {k: s for _, part in parts for k, s in part.items()}

    want, got = stats(full), stats(lean)
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        np.testing.assert_array_equal(got[key].channel_absmax, w.channel_absmax)
        np.testing.assert_array_equal(got[key].sample, w.sample)
        if w.gram is not None:
            np.testing.assert_array_equal(got[key].gram, w.gram)


def test_quantized_by_segment_equals_all_at_once(tiny, tmp_path):
    proto, windows = tiny
    spec = QuantSpec(quant="int4", weight_rounding="gptq", kv_cache_dtype="int8")
    graph = ir.from_proto(proto)
    tensors = calibration_tensors(graph, spec)
    grams = gptq_keys(graph, spec)
    whole = OrtRunner.from_model(proto, -(-SEQ // BLOCK), extra_outputs=tuple(tensors.values()))
    want_report = quantize_graph(
        graph, collect_stats(whole, tensors, windows, gram_keys=grams), spec
    )
    want = {t.name: numpy_helper.to_array(t) for t in ir.to_proto(graph).graph.initializer}

    # Segment by segment, through the cache: each part is saved, quantized, then dropped.
    cache = StatsCache(tmp_path / "cache", build_reserve(proto.ByteSize()))  # the tiny build's
    runner = LayerwiseRunner(proto, extra_outputs=tuple(dict.fromkeys(tensors.values())))
    parts = ir.from_proto(proto)
    quantizer = GraphQuantizer(parts, spec)
    for segment, stats in collect_by_segment(runner, tensors, windows, gram_keys=grams):
        cache.save(segment, stats)
        quantizer.quantize(stats)
    assert not cache.is_complete()  # not marked: a later build would calibrate again
    cache.mark_complete()
    report = quantizer.finish()
    got = {t.name: numpy_helper.to_array(t) for t in ir.to_proto(parts).graph.initializer}

    assert report.modules == want_report.modules  # formats, amax, scales per module
    assert report.kv_cache == want_report.kv_cache and report.counts == want_report.counts
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)

    # A complete cache gives the same statistics back, one segment file at a time.
    again = GraphQuantizer(ir.from_proto(proto), spec)
    for _, stats in cache.segments():
        again.quantize(stats)
    assert again.finish().modules == want_report.modules


def test_accuracy_report_equals_whole_graph_scoring(tmp_path, monkeypatch):
    """The build's accuracy report (reference run one segment at a time, its logits spilled to
    disk, the engine loaded after and run in chunked-prefill steps of ``LOGITS_ROWS``
    positions, here 16 of a window's 48) equals scoring the whole float graph and the engine
    side by side (``evaluate_accuracy``, one prefill step per window) on the same windows."""
    from llmc.calibration.accuracy import evaluate_accuracy
    from llmc.compiler.backends.onnxruntime import accuracy
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.compiler.quantize import texts
    from llmc.compiler.quantize.search import assignment_eval
    from tests.tiny_models import SHAKESPEARE

    ckpt = make_tiny_gemma3(tmp_path / "ckpt", seed=2, sharp=True)
    data = tmp_path / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:40_000])
    config = BuildConfig.of(
        model=str(ckpt),
        quant="int8",
        block_size=BLOCK,
        calib_data=str(data),
        calib_samples=3,
        calib_seq_len=SEQ,
        eval_samples=3,
        cache_dir=str(tmp_path / "cache"),
        output=str(tmp_path / "e"),
    )
    engine_dir = build(config).engine_dir
    src = resolve_model(str(ckpt))
    model, tokenizer = load_model(src, "float32"), load_tokenizer(src)
    proto, _ = float_graph(model, BLOCK)
    _, heldout = texts.text_sources(config.calibration)
    monkeypatch.setattr(assignment_eval, "LOGITS_ROWS", 16)
    got = accuracy.accuracy_report(
        config, proto, engine_dir, model, tokenizer, heldout, None, tmp_path
    )
    windows = texts.windows_of(heldout, model, tokenizer, 3, SEQ)
    blocks = -(-SEQ // BLOCK)
    want = evaluate_accuracy(
        OrtRunner.from_model(proto, blocks),
        OrtRunner(engine_dir, blocks),
        windows,
        BLOCK,
        heldout.describe(),
    )
    # The same logits; the float64 sums of a window's rows are added per chunk (1e-15 apart).
    assert got.to_dict() == pytest.approx(want.to_dict(), rel=1e-12, abs=1e-12)
    assert got.num_windows == 3 and 0 < got.top1_agreement <= 1


@pytest.mark.parametrize(
    ("op", "zero_point", "packed"),
    [
        ("QuantizeLinear", onnx.TensorProto.FLOAT8E4M3FN, False),  # FP8 emulation: float MatMuls
        ("DequantizeLinear", onnx.TensorProto.FLOAT8E4M3FN, False),
        ("QuantizeLinear", onnx.TensorProto.INT8, True),  # W8A8: MatMulIntegerToFloat
        ("DequantizeLinear", onnx.TensorProto.UINT4, True),  # block-wise int4: MatMulNBits
        ("QuantizeLinear", None, True),  # no zero point: uint8
    ],
)
def test_packed_weights_only_where_an_integer_kernel_needs_them(op, zero_point, packed):
    """A segment runs with packed weights when ORT fuses its Q/DQ into an integer kernel, not
    for FP8 Q/DQ, whose float MatMuls (a float vocabulary projection's 0.67 GB among them) need
    no packed copy."""
    from onnx import helper

    from llmc.runtime.runners.packed_weights import needs_packed_weights

    inits = [numpy_helper.from_array(np.ones(1, np.float32), "scale")]
    inputs = ["x", "scale"]
    if zero_point is not None:
        inits.append(helper.make_tensor("zero_point", zero_point, [1], [0]))
        inputs.append("zero_point")
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"])], "g", io[:1], io[1:], inits)
    assert needs_packed_weights(helper.make_model(graph)) is packed
