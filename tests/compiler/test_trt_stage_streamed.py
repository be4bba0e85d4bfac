"""The streamed portable stage of ``llmc build --arch sm90`` (weights read from the checkpoint,
lowered and written one tensor at a time) against the in-memory stage it replaces: the same
graph, the same weights bit for bit, the same manifest facts, at ``--quant`` fp8, int4 and
none; and the streamed lowering reads no weight."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from llmc.compiler.backends.tensorrt import backend as trt_backend
from llmc.compiler.backends.tensorrt.finish import TensorRTUnavailableError
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.frontend import export_cache
from llmc.compiler.memory import plan as memory_plan
from llmc.compiler.quantize.formats.int8_weights import (
    blockwise_int8_to_per_channel,
    lazy_blockwise_int8_to_per_channel,
)
from llmc.engine import stage as st
from tests.tiny_models import SHAKESPEARE, bfloat16_copy, make_tiny_gemma3

#: Stages only the streamed path runs.
STREAMED_STAGES = {"write the float graph", "write the stage's weights"}


class StageNames:
    """A progress that records the names of the stages a build runs."""

    def __init__(self) -> None:
        self.names: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str, peak=None):
        self.names.append(name)
        yield lambda done, total: None


@pytest.fixture(scope="module", autouse=True)
def exports_of_this_process(tmp_path_factory) -> Iterator[Path]:
    """The export cache of this module's process alone: a tiny Gemma 3's exported value names
    follow the exporting process's hash seed (its RoPE tables are built in ``set`` order), so a
    streamed build reading an export another process cached would name values other than this
    process's in-memory build does."""
    root = tmp_path_factory.mktemp("cache_home")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(export_cache, "cache_home", lambda: root)
        yield root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """(tiny Gemma 3 checkpoint: tied embedding, two rotary tables, MQA; calibration text)."""
    root = tmp_path_factory.mktemp("trt_streamed")
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:40_000])
    return make_tiny_gemma3(root / "ckpt", seed=4), data


def _stage(checkpoint, quant: str, out: Path, cache: Path) -> tuple[Path, list[str]]:
    """Write the sm90 stage of ``quant`` to ``out``; returns it and the stages run."""
    ckpt, data = checkpoint
    options = dict(model=str(ckpt), arch="sm90", quant=quant, block_size=8, max_seq_len=128)
    options |= dict(calib_data=str(data), calib_samples=3, calib_seq_len=32, int4_block_size=64)
    config = BuildConfig.of(**options, cache_dir=str(cache), output=str(out))
    progress = StageNames()
    with pytest.raises(TensorRTUnavailableError):  # no TensorRT and GPU here: the stage only
        build(config, progress)
    return out, progress.names


def _no_weights_read(lower):
    """``lower_streamed`` with the work directory's weight files moved away while it runs:
    it must not read one."""

    def wrapped(proto, weights_dir: Path, *args):
        files = sorted(weights_dir.glob("*.data"))
        assert files  # the graph's weights are there, external
        for f in files:
            f.rename(f.with_suffix(".away"))
        try:
            return lower(proto, weights_dir, *args)
        finally:
            for f in files:
                f.with_suffix(".away").rename(f)

    return wrapped


def canonical(graph: onnx.GraphProto) -> tuple[list[tuple], list[tuple]]:
    """The graph without its names: (domain, op, inputs, outputs, attributes) of every node in
    order, and the sorted (value, type) of its value_info, with each value the graph computes
    named by the node and output index that produce it (the two exports name intermediate
    values and nodes differently; graph inputs, outputs and weights keep their names)."""
    outputs = {o.name for o in graph.output}
    names = {}
    for i, n in enumerate(graph.node):
        for k, o in enumerate(n.output):
            names[o] = o if o in outputs else f"%{i}.{k}"
    nodes = []
    for n in graph.node:
        attrs = []
        for a in n.attribute:
            v = helper.get_attribute_value(a)
            if isinstance(v, TensorProto):
                v = (v.data_type, tuple(v.dims), numpy_helper.to_array(v).tobytes())
            attrs.append((a.name, v))
        rename = [names.get(x, x) for x in n.input]
        nodes.append((n.domain, n.op_type, rename, [names[o] for o in n.output], attrs))
    infos = sorted(
        (names.get(v.name, v.name), v.type.SerializeToString()) for v in graph.value_info
    )
    return nodes, infos


def weights(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    """Initializer name -> (element type, shape, value bytes), external data loaded."""
    return {
        t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
        for t in model.graph.initializer
    }


def manifest_facts(stage_dir: Path) -> dict:
    """The stage manifest (every file's digest verified) without its files and time."""
    facts = asdict(st.read_stage(stage_dir))
    del facts["files"], facts["created_at"]
    return facts


@pytest.fixture(scope="module")
def bf16_checkpoint(checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny Gemma 3 saved in bfloat16: its streamed float graph stores bf16 weights."""
    ckpt, data = checkpoint
    return bfloat16_copy(ckpt, tmp_path_factory.mktemp("trt_bf16") / "ckpt"), data


@pytest.mark.parametrize(
    "quant,source",
    [
        ("fp8", "checkpoint"),
        ("int4", "checkpoint"),
        ("none", "checkpoint"),
        ("none", "bf16_checkpoint"),
    ],
)
def test_streamed_stage_equals_in_memory_stage(quant, source, request, tmp_path, monkeypatch):
    checkpoint = request.getfixturevalue(source)
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        m.setattr(trt_backend, "lower_streamed", _no_weights_read(trt_backend.lower_streamed))
        streamed, ran = _stage(checkpoint, quant, tmp_path / "streamed", cache)
    # Each build calibrates (same options, same cache path): cached statistics hold GPTQ's Gram
    # matrices in float32, which can move a code by one step against a fresh float64 one.
    if cache.exists():
        cache.rename(tmp_path / "cache.streamed")
    assert STREAMED_STAGES <= set(ran)
    assert ("write the quantized graph" in ran) == (quant != "none")
    with monkeypatch.context() as m:
        # A source that cannot stream: plan_memory decides with it, and the build follows it.
        m.setattr(memory_plan, "can_stream", lambda src: False)
        whole, ran = _stage(checkpoint, quant, tmp_path / "whole", cache)
    assert not STREAMED_STAGES & set(ran)
    assert not list(tmp_path.glob(".*work*"))  # the scratch directory is gone

    assert manifest_facts(streamed) == manifest_facts(whole)
    a = onnx.load(str(streamed / st.MODEL_FILE))  # with external data
    b = onnx.load(str(whole / st.MODEL_FILE))
    assert canonical(a.graph) == canonical(b.graph)
    for x, y in [(a.graph.input, b.graph.input), (a.graph.output, b.graph.output)]:
        assert [v.SerializeToString() for v in x] == [v.SerializeToString() for v in y]
    assert a.opset_import == b.opset_import and a.metadata_props == b.metadata_props
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name] == wb[name], name  # bit for bit

    # The weights the lowering changes are among them: bfloat16 casts, float32 rotary tables,
    # FP8 / INT4 codes, the 8-bit weight-only layers made per-channel INT8.
    types = {t for t, _, _ in wa.values()}
    assert TensorProto.BFLOAT16 in types and TensorProto.FLOAT in types
    assert (TensorProto.FLOAT8E4M3FN in types) == (quant == "fp8")
    assert (TensorProto.INT4 in types) == (quant == "int4")
    per_channel = [
        n
        for n in a.graph.node
        if n.op_type == "DequantizeLinear" and wa.get(n.input[0], (0,))[0] == TensorProto.INT8
    ]
    assert len(per_channel) == {"fp8": 1, "int4": 3, "none": 0}[quant]  # lm_head (+ down_proj)
    for n in per_channel:  # one bfloat16 scale per output channel
        assert [(x.name, x.i) for x in n.attribute] == [("axis", 1)]
        columns = wa[n.input[0]][1][1]
        assert wa[n.input[1]][:2] == (TensorProto.BFLOAT16, (columns,))


def _blockwise_graph(q: np.ndarray, block_scale: np.ndarray, block: int) -> onnx.ModelProto:
    """x [1, K] @ DQ(q [K, N] int8, block-wise along K) -> y, as the 8-bit weight-only layers."""
    k, n = q.shape
    dq = helper.make_node("DequantizeLinear", ["w", "s"], ["w_dq"], "dq", axis=0, block_size=block)
    graph = helper.make_graph(
        [dq, helper.make_node("MatMul", ["x", "w_dq"], ["y"], "mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(q, "w"), numpy_helper.from_array(block_scale, "s")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_lazy_per_channel_int8_equals_the_in_memory_rewrite(tmp_path):
    """The lazy rewrite reads nothing until saved, then writes the weights the in-memory one
    computes; both equal the unchunked per-channel formula across a 4,096-channel chunk."""
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (200, 4096 + 40)).astype(np.int8)  # 4 blocks, the last short
    s = rng.uniform(0.001, 0.05, (4, q.shape[1])).astype(np.float32)
    onnx.save(_blockwise_graph(q, s, 64), str(tmp_path / "in.onnx"), save_as_external_data=True)
    lazy = ir.load(tmp_path / "in.onnx")
    data = next(tmp_path.glob("*.data"))
    data.rename(tmp_path / "away")
    assert lazy_blockwise_int8_to_per_channel(lazy) == 1  # reads no weight
    (tmp_path / "away").rename(data)
    ir.save(lazy, tmp_path / "out.onnx", external_data="out.onnx.data")
    streamed = onnx.load(str(tmp_path / "out.onnx"))
    whole = _blockwise_graph(q, s, 64)
    assert blockwise_int8_to_per_channel(whole) == 1
    assert canonical(streamed.graph)[0] == canonical(whole.graph)[0]  # the nodes
    assert weights(streamed) == weights(whole)
    w = q.astype(np.float32) * np.repeat(s, 64, axis=0)[:200]
    scale = np.maximum(np.abs(w).max(axis=0), np.float32(1e-12)) / 127
    codes = np.clip(np.round(w / scale), -128, 127).astype(np.int8)
    assert weights(whole)["w"][2] == codes.tobytes()
    assert weights(whole)["s"][1:] == ((q.shape[1],), scale.tobytes())
