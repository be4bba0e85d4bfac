"""``llmc build --quant`` end to end on a tiny Gemma 3: calibration from a file, statistics
cache, manifest records, accuracy report, a working engine, and errors before any work."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from llmc.calibration.data import CalibrationDataError
from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import OP_TYPE as BLOCK_INT8
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine.isa import detect_host_isa
from llmc.engine.manifest import read_manifest
from llmc.errors import BuildConfigError
from llmc.plugins.int8_matmul import block_int8_matmul_isa
from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3


class RecordingProgress:
    """A real BuildProgress stand-in that only records the stage names."""

    def __init__(self):
        self.stages: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str, peak=None):
        self.stages.append(name)
        yield lambda done, total: None


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("qbuild")
    ckpt = make_tiny_gemma3(root / "ckpt", seed=1, sharp=True)
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:60_000])
    return root, ckpt, data


def _config(root, ckpt, data, quant, name, **kw) -> BuildConfig:
    options = dict(
        model=str(ckpt),
        quant=quant,
        block_size=8,
        max_seq_len=128,
        calib_data=str(data),
        calib_samples=4,
        calib_seq_len=64,
        eval_samples=2,
        int4_block_size=32,
        cache_dir=str(root / "cache"),
        output=str(root / name),
    )
    return BuildConfig.of(**(options | kw))


@pytest.mark.parametrize("quant", ["int8", "int4", "fp8"])
def test_quantized_build_records_report_and_serves(setup, quant):
    root, ckpt, data = setup
    kv = "int8" if quant == "int8" else "auto"
    result = build(_config(root, ckpt, data, quant, quant, kv_cache_dtype=kv))
    m = read_manifest(result.engine_dir)
    assert m.quant == quant and m.kv_cache_dtype == ("int8" if kv == "int8" else "float32")
    q = m.quantization
    assert sum(q["counts"].values()) == len(q["modules"]) > 0
    assert all(r["found"] >= r["expected"] > 0 for r in q["fast_path"].values())
    assert q["spec"]["calibration"]["data"].endswith("(first 80%)")
    acc = m.accuracy_report
    assert acc["data"].startswith(str(data.resolve()))
    assert acc["num_tokens"] == 2 * 63
    assert 0.0 <= acc["top1_agreement"] <= 1.0 and acc["mean_kl"] >= 0.0
    assert acc["perplexity"] > 1.0 and acc["perplexity_reference"] > 1.0
    # the 8-bit weight-only modules (the vocabulary projection; int4's down_proj too; K = 64 or
    # 128 in blocks of 32) on llmc's int8 kernel where this host runs it, MatMulNBits elsewhere
    graph = onnx.load(str(result.engine_dir / "engine.onnx"), load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    kernel_isa = block_int8_matmul_isa(detect_host_isa().features)
    weight_only8 = q["counts"].get("int8_weight_only", 0)
    assert weight_only8 > 0
    assert ops.count(BLOCK_INT8) == (weight_only8 if kernel_isa else 0)
    assert kernel_isa is None or kernel_isa in m.isa  # the engine requires what its kernel needs
    # the record and the build's summary say which of ORT's fused nodes run on llmc's kernel
    runs_as = {BLOCK_INT8: ops.count(BLOCK_INT8)} if kernel_isa else {}
    assert q["fast_path"]["MatMulNBits"].get("runs_as", {}) == runs_as
    said = f"(engine.onnx runs {ops.count(BLOCK_INT8)} as {BLOCK_INT8})"
    assert (said in result.format()) == bool(kernel_isa)
    out = LLM(result.engine_dir).generate(
        ["ROMEO:"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 8


def test_weight_only_recipe_runs_every_projection_8_bit_in_blocks_of_32(setup):
    root, ckpt, data = setup
    result = build(_config(root, ckpt, data, "int8", "wo", recipe="weight-only"))
    m = read_manifest(result.engine_dir)
    q = m.quantization
    assert m.build_config["quantization"]["recipe"] == "weight-only"
    assert set(q["counts"]) == {"int8_weight_only"} and not q["excluded"]
    graph = onnx.load(str(result.engine_dir / "engine.onnx"), load_external_data=False)
    eight_bit = [n for n in graph.graph.node if n.op_type in ("MatMulNBits", BLOCK_INT8)]
    assert len(eight_bit) == q["counts"]["int8_weight_only"]
    blocks = {a.i for n in eight_bit for a in n.attribute if a.name == "block_size"}
    assert blocks == {32}
    assert not [n for n in graph.graph.node if n.op_type == "MatMulIntegerToFloat"]


def test_second_build_reuses_cached_statistics(setup):
    root, ckpt, data = setup
    cache = dict(cache_dir=str(root / "reused-cache"))  # no other test's statistics in it
    first = RecordingProgress()
    a = build(_config(root, ckpt, data, "int8", "a", calib_method="max", **cache), first)
    second = RecordingProgress()
    # another output (and kv dtype) but the same model, data and method: no calibration run
    b = build(_config(root, ckpt, data, "int8", "b", calib_method="max", **cache), second)
    assert any(s.startswith("calibrate") for s in first.stages)
    assert not any(s.startswith("calibrate") for s in second.stages)
    uses = [read_manifest(r.engine_dir).quantization["spec"]["calibration"] for r in (a, b)]
    assert [u["cache"] for u in uses] == ["saved", "read"]
    # The build that read the statistics is the build that saved them: same weights, same report.
    weights = [_initializers(r.engine_dir / "engine.onnx") for r in (a, b)]
    assert weights[0].keys() == weights[1].keys()
    assert all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])
    reports = [read_manifest(r.engine_dir).accuracy_report for r in (a, b)]
    assert reports[0]["perplexity"] == reports[1]["perplexity"]
    third = RecordingProgress()
    build(_config(root, ckpt, data, "int8", "c", calib_method="mse", **cache), third)
    assert any(s.startswith("calibrate") for s in third.stages)


def _initializers(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_bad_calibration_file_fails_before_any_work(setup, tmp_path):
    root, ckpt, _ = setup
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    progress = RecordingProgress()
    with pytest.raises(CalibrationDataError, match="empty"):
        build(_config(root, ckpt, empty, "int8", "never"), progress)
    assert progress.stages == ["resolve model"]  # no weights loaded, nothing exported
    assert not (root / "never").exists()
    with pytest.raises(CalibrationDataError):
        build(_config(root, ckpt, tmp_path / "missing.jsonl", "int8", "never"))


def test_precision_the_target_lacks_and_unknown_quant_fail_at_validation(setup):
    root, ckpt, data = setup
    with pytest.raises(BuildConfigError, match="sm89"):
        _config(root, ckpt, data, "fp8", "x", arch="sm80").validate()
    with pytest.raises(BuildConfigError, match="sm89"):
        _config(root, ckpt, data, "int8", "x", arch="sm86", kv_cache_dtype="fp8").validate()
    with pytest.raises(BuildConfigError, match="--quant"):
        _config(root, ckpt, data, "nf4", "x").validate()
    with pytest.raises(BuildConfigError, match="smoothquant-alpha"):
        _config(root, ckpt, data, "int8", "x", smoothquant_alpha=2.0).validate()
