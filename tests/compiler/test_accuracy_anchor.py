"""The accuracy anchor: llama.cpp's Q8_0 against the ``gguf`` package's reference, and the
anchor a quantized build scores beside its report (round-to-nearest for safetensors, Q8_0 for
a GGUF checkpoint)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine.manifest import read_manifest
from llmc.quant.ggml_q8_0 import quantize_q8_0
from llmc.quant.grids import dequantize
from tests.compiler.test_gguf_streaming import write_tiny_gguf
from tests.tiny_models import calibration_text, make_tiny_gemma3, quant_config


def _gguf_q8_0(w: np.ndarray) -> np.ndarray:
    """gguf-py's Q8_0 (bit-exact with ggml-quants.c, its docstring says) of ``w`` [K, N], whose
    rows in ggml order are the columns of ``w``; dequantized, [K, N]."""
    rows = np.ascontiguousarray(w.T)
    q = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0)
    return gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).T


def test_q8_0_is_llama_cpps_bit_for_bit():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 48)).astype(np.float32) * 0.05
    w[:32, 0] = 0.0  # an all-zero block
    w[32:64, 1] = np.linspace(-1, 1, 32, dtype=np.float32)
    # Halfway codes: max 127 so d = 1, then x / d = k + 0.5 exactly (roundf goes away from 0).
    w[64:96, 2] = np.float32(127)
    w[65:96, 2] = np.arange(31, dtype=np.float32) - np.float32(15.5)
    w[96:128, 3] = np.float32(1e-30)  # subnormal-range scales (float16 d underflows to 0)
    got = dequantize(quantize_q8_0(w))
    want = _gguf_q8_0(w)
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    assert not np.array_equal(got, w)


def test_q8_0_refuses_partial_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.ones((40, 4), np.float32))


def _config(model, root, name, quant, **kw) -> BuildConfig:
    data = calibration_text(root)
    return quant_config(model, root, data, quant, name, eval_samples=3, int4_block_size=32, **kw)


def test_safetensors_build_scores_round_to_nearest_beside_its_report(tmp_path):
    ckpt = make_tiny_gemma3(tmp_path / "ckpt", seed=1, sharp=True)
    result = build(_config(ckpt, tmp_path, "int4", "int4"))
    m = read_manifest(result.engine_dir)
    anchor = m.quantization["spec"]["anchor"]
    assert anchor["name"] == "rtn" and "source_types" not in anchor
    engine, rtn = m.accuracy_report, anchor["report"]
    assert rtn["num_tokens"] == engine["num_tokens"] == 3 * 63
    assert rtn["data"] == engine["data"]
    assert rtn["perplexity_reference"] == pytest.approx(engine["perplexity_reference"], rel=1e-6)
    # AWQ + GPTQ against plain round-to-nearest: different weights, different logits.
    assert rtn["mean_kl"] != engine["mean_kl"] and rtn["mean_kl"] > 0
    assert "round-to-nearest" in result.format()
    skipped = build(_config(ckpt, tmp_path, "int4-no-anchor", "int4", anchor="none"))
    assert "anchor" not in read_manifest(skipped.engine_dir).quantization["spec"]


def test_gguf_build_scores_llama_cpp_q8_0(tmp_path):
    path = write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3")
    result = build(_config(path, tmp_path, "int8", "int8"))
    m = read_manifest(result.engine_dir)
    anchor = m.quantization["spec"]["anchor"]
    assert anchor["name"] == "q8_0"
    stored = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert sum(anchor["source_types"].values()) == len(stored)
    assert 0 < anchor["report"]["mean_kl"]
    assert anchor["report"]["num_tokens"] == m.accuracy_report["num_tokens"]
    assert "llama.cpp Q8_0" in result.format()


def _two_layer_model():
    """An ir model of two 64x64 MatMuls named as layers' down projections."""
    import onnx_ir as ir

    rng = np.random.default_rng(0)
    x = ir.Value(name="x", shape=ir.Shape([2, 64]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes, value = [], x
    for i in range(2):
        w = ir.Value(
            name=f"w{i}", const_value=ir.tensor(rng.normal(size=(64, 64)).astype(np.float32))
        )
        w.shape, w.type = w.const_value.shape, ir.TensorType(ir.DataType.FLOAT)
        nodes.append(ir.node("MatMul", [value, w], name=f"model.layers.{i}.mlp.down_proj"))
        value = nodes[-1].outputs[0]
    graph = ir.Graph([x], [value], nodes=nodes, opset_imports={"": 21}, name="g")
    for node in nodes:
        graph.register_initializer(node.inputs[1])
    return ir.Model(graph, ir_version=10)


def _anchor(spill_dir):
    """The round-to-nearest anchor of an int4 spec whose down projections are 8-bit
    weight-only (no statistics needed), made whole."""
    from llmc.compiler.quantize.anchors import AnchorQuantization
    from llmc.quant.protocol import QuantSpec

    spec = QuantSpec(quant="int4", weight_only8=("*.down_proj",), int4_block_size=32)
    anchors = AnchorQuantization(_two_layer_model(), spec, None, spill_dir)
    anchors.finish()
    return anchors.precomputed


def _search_formats(spill_dir):
    """The fp8 ``--accuracy-target`` search's modules in each format of their ladder (fp8,
    8-bit weight-only), from synthetic activation statistics."""
    from llmc.calibration.observers import TensorStats
    from llmc.compiler.quantize.search.targeted import TargetedQuantization
    from llmc.quant.protocol import QuantSpec

    rng = np.random.default_rng(1)
    sample = rng.normal(size=(16, 64)).astype(np.float32)
    stats = TensorStats(np.abs(sample).max(0), np.abs(sample).sum(0, dtype=np.float64), 16, sample)
    targeted = TargetedQuantization(
        _two_layer_model(), QuantSpec(quant="fp8"), "cpu", "float32", spill_dir
    )
    targeted.add({f"model.layers.{i}.mlp.down_proj": stats for i in range(2)})
    targeted.finish()
    return targeted.precomputed


@pytest.mark.parametrize("make,count", [(_anchor, 2), (_search_formats, 4)])
def test_search_and_anchor_weights_go_to_disk_as_they_are_made(make, count, tmp_path):
    """With a spill directory (a streamed build) each anchor weight, and each module's weight
    in each format the search may give it, is a read-only memory map of a file there, equal to
    the one made in memory: a build holds one layer's, not the model's."""
    from llmc.compiler.quantize.tensor_spill import drop_pages

    in_memory, spilled = make(None), make(tmp_path)
    assert len(spilled) == count
    for key, ql in spilled.items():
        assert isinstance(ql.weight.data, np.memmap) and not ql.weight.data.flags.writeable
        assert Path(ql.weight.data.filename).parent == tmp_path
        assert not isinstance(in_memory[key].weight.data, np.memmap)
        np.testing.assert_array_equal(ql.weight.data, in_memory[key].weight.data)
        np.testing.assert_array_equal(ql.weight.scale, in_memory[key].weight.scale)
        drop_pages(ql.weight.data)  # once written into a segment: read from disk again if used
        np.testing.assert_array_equal(ql.weight.data, in_memory[key].weight.data)
    drop_pages(np.ones(3))  # not a memory map: left alone
