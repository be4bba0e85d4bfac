"""The streamed build (weights read from the checkpoint one tensor at a time) against the
in-memory build it replaces: the same weights bit for bit, the same logits; and the memory plan
that refuses a build before any weight is read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from llmc.compiler.backends.onnxruntime.host import plan_cpu
from llmc.compiler.backends.onnxruntime.lower import lower_to_cpu
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.plan import plan_memory
from llmc.compiler.stages.export import export
from llmc.compiler.stages.load import load, resolve
from llmc.engine.plan import load_plan
from llmc.engine.plugin import node_fpmath_mode, plugin_nodes
from llmc.errors import BuildConfigError
from llmc.runtime.runners.ort_runner import OrtRunner
from llmc.runtime.runners.step_inputs import single_prefill
from tests.tiny_models import bfloat16_copy, make_tiny_gemma3, make_tiny_llama


def weight_digests(engine_dir: Path) -> list[tuple[tuple[int, ...], str]]:
    """(shape, sha256 of the bytes) of every initializer over the engine's segments, sorted:
    the weights whatever they are named."""
    out = []
    for path in sorted((engine_dir / "segments").glob("segment_*.onnx")):
        model = onnx.load(str(path))  # with external data
        for t in model.graph.initializer:
            a = numpy_helper.to_array(t)
            out.append(
                (tuple(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
            )
    return sorted(out)


def in_memory_engine(ckpt: Path, out: Path, block_size: int) -> Path:
    """The engine the in-memory path writes: the whole float32 model loaded, exported in memory,
    lowered as build() lowers it on this host (llmc's norm ops where the op library is built)."""
    config = BuildConfig.of(model=str(ckpt), block_size=block_size)
    model = load(resolve(config.source))  # no memory plan: the weights are loaded whole
    graph = export(model, config.export, share_tied=True)  # as build() does for --quant none
    assert graph.weights_dir is None
    lower_to_cpu(graph.proto, out, llmc_norms=plan_cpu(config).llmc_norms)
    return out


def prefill_logits(engine_dir: Path, block_size: int) -> np.ndarray:
    """Logits of every position of one 11-token prefill (crosses blocks and the window)."""
    ids = np.array([5, 17, 3, 99, 42, 7, 256, 1, 300, 12, 64], np.int64)
    blocks = -(-len(ids) // block_size)
    return OrtRunner(engine_dir, blocks + 1).execute(single_prefill(ids, block_size))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_streamed_engine_equals_in_memory_engine(family, tmp_path):
    make = make_tiny_llama if family == "llama" else make_tiny_gemma3
    ckpt = make(tmp_path / "ckpt", sharp=True)
    streamed = build(BuildConfig.of(model=str(ckpt), block_size=4, output=str(tmp_path / "s")))
    stats = json.loads((streamed.engine_dir / "manifest.json").read_text())["build_stats"]
    assert stats["memory_plan"]["streamed"] is True
    whole = in_memory_engine(ckpt, tmp_path / "m", 4)
    assert weight_digests(streamed.engine_dir) == weight_digests(whole)
    np.testing.assert_array_equal(prefill_logits(streamed.engine_dir, 4), prefill_logits(whole, 4))


def test_bfloat16_checkpoint_streams_to_the_float32_weights_transformers_loads(tmp_path):
    """A bf16 checkpoint is converted to float32 tensor by tensor, as from_pretrained does."""
    bf16 = bfloat16_copy(make_tiny_llama(tmp_path / "f32", sharp=True), tmp_path / "bf16")
    streamed = build(BuildConfig.of(model=str(bf16), block_size=4, output=str(tmp_path / "s")))
    whole = in_memory_engine(bf16, tmp_path / "m", 4)
    assert weight_digests(streamed.engine_dir) == weight_digests(whole)
    np.testing.assert_array_equal(prefill_logits(streamed.engine_dir, 4), prefill_logits(whole, 4))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bfloat16_float_graph_is_stored_at_half_width(family, tmp_path, monkeypatch):
    """The float graph of a bf16 checkpoint is written in bf16 (half the bytes) and reads back
    as the float32 graph written without storing: same initializers, names and values."""
    from llmc.compiler.frontend import streamed_export as streaming_export
    from llmc.compiler.frontend.streamed_export import FLOAT_GRAPH, load_float_graph

    make = make_tiny_llama if family == "llama" else make_tiny_gemma3
    bf16 = bfloat16_copy(make(tmp_path / "f32", sharp=True), tmp_path / "bf16")
    config = BuildConfig.of(model=str(bf16), block_size=4)
    resolved = resolve(config.source)
    model = load(resolved, memory=plan_memory(resolved.source, "none", cpu=True, limit_gb=None))
    assert model.streamed is not None
    export(model, config.export, work_dir=tmp_path / "stored", in_flight_bytes=1 << 20)
    monkeypatch.setattr(streaming_export, "checkpoint_float_dtype", lambda _: None)
    export(model, config.export, work_dir=tmp_path / "wide", in_flight_bytes=1 << 20)

    stored_bytes = (tmp_path / "stored" / (FLOAT_GRAPH + ".data")).stat().st_size
    wide_bytes = (tmp_path / "wide" / (FLOAT_GRAPH + ".data")).stat().st_size
    assert stored_bytes < 0.55 * wide_bytes
    folded, wide = (
        {n: v.const_value.numpy() for n, v in load_float_graph(d).graph.initializers.items()}
        for d in (tmp_path / "stored", tmp_path / "wide")
    )
    assert folded.keys() == wide.keys()
    for name, values in wide.items():
        assert folded[name].dtype == values.dtype, name
        np.testing.assert_array_equal(folded[name], values, err_msg=name)


def test_max_build_memory_refuses_before_reading_weights(tiny_llama_dir, tmp_path):
    out = tmp_path / "e"
    with pytest.raises(
        BuildConfigError, match=r"needs at least \d+\.\d GB .*--max-build-memory 0.5"
    ):
        build(BuildConfig.of(model=str(tiny_llama_dir), max_build_memory=0.5, output=str(out)))
    limit = 0.9
    with pytest.raises(
        BuildConfigError, match=r"needs at least \d+\.\d GB .*--max-build-memory 0.8"
    ):
        build(
            BuildConfig.of(
                model=str(tiny_llama_dir), quant="int8", max_build_memory=0.8, output=str(out)
            )
        )
    assert not out.exists()
    result = build(
        BuildConfig.of(model=str(tiny_llama_dir), max_build_memory=limit, output=str(out))
    )
    stats = json.loads((result.engine_dir / "manifest.json").read_text())["build_stats"]
    plan = stats["memory_plan"]
    assert plan["streamed"] and plan["need_bytes"] <= limit * 1e9
    assert 0 < plan["in_flight_bytes"] < 512 << 20  # shrunk to fit the limit
    assert set(stats["stages"]) >= {
        "resolve model",
        "export to ONNX",
        "lower to ONNX Runtime (cpu)",
    }


def test_quantized_build_fits_a_limit_of_engine_plus_one_layer(tmp_path):
    """A quantized build calibrates and quantizes one segment at a time: a 74 MB float32
    checkpoint (vocabulary 32,000) builds int8 under a limit that holding the float graph
    and every layer's statistics (6.5x the float32 weights, the whole-graph calibration's
    measured factor) would exceed, and the plan's engine estimate matches the engine."""
    ckpt = make_tiny_llama(tmp_path / "ckpt", vocab_size=32000, hidden_size=256)
    data = tmp_path / "calib.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    limit = 1.0
    result = build(
        BuildConfig.of(
            model=str(ckpt),
            quant="int8",
            max_build_memory=limit,
            calib_data=str(data),
            calib_samples=4,
            calib_seq_len=64,
            eval_samples=2,
            output=str(tmp_path / "e"),
        )
    )
    plan = json.loads((result.engine_dir / "manifest.json").read_text())["build_stats"]
    plan = plan["memory_plan"]
    assert plan["streamed"] and plan["need_bytes"] <= limit * 1e9
    assert 0.8e9 + 6.5 * plan["float32_weight_bytes"] > limit * 1e9
    data_bytes = sum(f.stat().st_size for f in (result.engine_dir / "segments").glob("*.data"))
    assert abs(plan["engine_weight_bytes"] - data_bytes) < 0.1 * data_bytes


def test_tied_embedding_is_stored_once(tmp_path):
    """Gemma ties its [V, H] embedding to the vocabulary projection: the first segment's Gather
    and the last segment's Gemm read one copy of the table, in one data file."""
    from onnx.external_data_helper import ExternalDataInfo

    ckpt = make_tiny_gemma3(tmp_path / "ckpt", sharp=True)
    engine = build(BuildConfig.of(model=str(ckpt), block_size=4, output=str(tmp_path / "e")))
    places, readers = set(), []
    for path in sorted((engine.engine_dir / "segments").glob("segment_*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        for t in model.graph.initializer:
            if tuple(t.dims) == (512, 64):  # vocabulary x hidden
                info = ExternalDataInfo(t)
                places.add((info.location, info.offset))
                readers += [n.op_type for n in model.graph.node if t.name in n.input]
    assert len(places) == 1
    assert sorted(readers) == ["Gather", "Gemm"]
    # engine.onnx: the same bytes under one name per reader, so ONNX Runtime maps them apart
    # (the Gemm prepacks and drops its mapping; the Gather's is paged in by row).
    joined = onnx.load(str(engine.engine_dir / "engine.onnx"), load_external_data=False)
    tables = {t.name: t for t in joined.graph.initializer if tuple(t.dims) == (512, 64)}
    by_reader = {
        n.op_type: n.input[0 if n.op_type == "Gather" else 1]
        for n in joined.graph.node
        if set(n.input) & tables.keys()
    }
    assert sorted(by_reader) == ["Gather", "Gemm"]
    assert by_reader["Gather"] != by_reader["Gemm"]
    infos = [ExternalDataInfo(tables[name]) for name in by_reader.values()]
    assert len({(i.location, i.offset, i.length) for i in infos}) == 1


def in_memory_quantized_engine(config: BuildConfig, out: Path) -> Path:
    """The engine the in-memory path writes for a quantized ``config``: the model loaded whole,
    the float graph exported and quantized in memory for this host (int8 weight pairs bound
    where it has no VNNI, as ``build`` does)."""
    from llmc.compiler.backends.onnxruntime.backend import OnnxRuntimeBackend
    from llmc.compiler.stages.progress import no_stage
    from llmc.compiler.stages.quantize import Reference, quantize, read_texts

    texts = read_texts(config)
    model = load(resolve(config.source))
    backend = OnnxRuntimeBackend()
    host = backend.plan_host(config)
    reference = Reference(model, export(model, config.export), texts)
    graph = quantize(reference, config, bound_pairs=host.bound_pairs)
    assert graph.weights_dir is None
    out.mkdir()
    backend.lower(graph, out, config, host, no_stage, memory=None)
    return out


@pytest.mark.parametrize(
    "quant,dtype",
    [("int8", "float32"), ("int4", "float32"), ("int8", "bfloat16"), ("fp8", "float32")],
)
def test_streamed_quantized_engine_equals_in_memory_engine(quant, dtype, tmp_path, monkeypatch):
    """The streamed build spills every quantized tensor to disk as it is made (threshold 0:
    the tiny model's are all below the default) and writes the in-memory build's engine; from
    a bf16 checkpoint through its float graph stored in bf16; FP8, which the CPU emulates,
    through its float32 weights written as they are quantized."""
    from llmc.compiler.quantize import tensor_spill
    from tests.tiny_models import SHAKESPEARE

    monkeypatch.setattr(tensor_spill, "SPILL_THRESHOLD_BYTES", 0)

    ckpt = make_tiny_llama(tmp_path / "ckpt", sharp=True)
    if dtype == "bfloat16":
        ckpt = bfloat16_copy(ckpt, tmp_path / "bf16")
    options = dict(model=str(ckpt), block_size=4, quant=quant, calib_data=str(SHAKESPEARE))
    options |= dict(calib_samples=8, eval_samples=4, cache_dir=str(tmp_path / "cache"))
    streamed = build(BuildConfig.of(**options, output=str(tmp_path / "s")))
    stats = json.loads((streamed.engine_dir / "manifest.json").read_text())["build_stats"]
    assert stats["memory_plan"]["streamed"] is True
    assert "write the quantized graph" in stats["stages"]
    whole = in_memory_quantized_engine(BuildConfig.of(**options), tmp_path / "m")
    for engine in (streamed.engine_dir, whole):  # a quantized build lets attention round to bf16
        plan = load_plan(engine)
        assert [p.fpmath_mode for p in plan.plugins] == ["bf16"] * 2
        graph = onnx.load(str(engine / plan.graph), load_external_data=False)
        assert [node_fpmath_mode(n) for n in plugin_nodes(graph)] == ["bf16"] * 2
    assert weight_digests(streamed.engine_dir) == weight_digests(whole)
    np.testing.assert_array_equal(prefill_logits(streamed.engine_dir, 4), prefill_logits(whole, 4))


def test_quantized_embedding_lookup_reads_the_quantized_projection(tmp_path):
    """int4 of a tied model: the vocabulary projection's 8-bit block-wise table (MatMulNBits)
    also serves the embedding lookup (GatherBlockQuantized over the same bytes); the float
    table is gone from the engine and the accuracy stays that of the quantized projection."""
    from onnx.external_data_helper import ExternalDataInfo

    from tests.tiny_models import SHAKESPEARE

    ckpt = make_tiny_gemma3(tmp_path / "ckpt", sharp=True, hidden_size=128)  # one 128-block
    options = dict(model=str(ckpt), quant="int4", calib_data=str(SHAKESPEARE), block_size=4)
    options |= dict(calib_samples=8, eval_samples=4, cache_dir=str(tmp_path / "cache"))
    result = build(BuildConfig.of(**options, output=str(tmp_path / "e")))
    segments = sorted((result.engine_dir / "segments").glob("segment_*.onnx"))
    first = onnx.load(str(segments[0]), load_external_data=False)
    last = onnx.load(str(segments[-1]), load_external_data=False)
    inits = {t.name: t for t in first.graph.initializer}
    gbq = [n for n in first.graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(gbq) == 1
    data = ExternalDataInfo(inits[gbq[0].input[0]])
    projection = next(
        t for t in last.graph.initializer if t.name.startswith("lm_head") and len(t.dims) == 3
    )
    assert (data.location, data.offset) == (
        ExternalDataInfo(projection).location,
        ExternalDataInfo(projection).offset,
    )
    floats = [
        t for s in segments for t in onnx.load(str(s), load_external_data=False).graph.initializer
    ]
    assert not [t for t in floats if tuple(t.dims) == (512, 128) and t.data_type == 1]
    assert result.accuracy_report.mean_kl < 0.01
