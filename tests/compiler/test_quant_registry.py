"""The quantization format registry: a format defined here, in the test, and registered with one
line flows through ``--quant``'s choices, ``BuildConfig``'s defaults and target rules, the Q/DQ
rewrite, the CPU lowering and its fast-path check, the accuracy report, the TensorRT lowering
and lint, and serving, with no other file touched."""

from __future__ import annotations

import numpy as np
import pytest

from llmc.cli import build_parser
from llmc.compiler.backends.tensorrt.finish import TensorRTUnavailableError
from llmc.compiler.build import build
from llmc.compiler.config.build_config import QUANTS, BuildConfig
from llmc.compiler.quantize.formats import FORMATS, WEIGHT_ONLY8
from llmc.engine.manifest import read_manifest
from llmc.engine.stage import read_stage
from llmc.errors import BuildConfigError
from llmc.quant.grids import INT8, quantize_weight_per_channel
from llmc.quant.protocol import (
    ActivationStats,
    FormatDefaults,
    QuantFormat,
    QuantizedLinear,
    QuantSpec,
)
from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3


class Int8PerChannelWeightOnly(QuantFormat):
    """W8A16 with one scale per output channel: ``X -> MatMul <- DQ(int8 W, per-channel)``. No
    activation statistics, no fused ONNX Runtime kernel (ORT folds the DQ into float weights),
    TensorRT's per-channel INT8 weights on sm90 and newer (an arbitrary rule, to test it)."""

    name = "w8pc"
    label = "int8_per_channel_weight_only"
    summary = "8-bit weight-only, per-channel"
    needs_stats = False
    defaults = FormatDefaults("max", weight_only8="", exclude="*.down_proj")
    min_sm = 90

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        qw = quantize_weight_per_channel(weight, INT8)
        return QuantizedLinear(qw, record={"format": self.label})


@pytest.fixture
def registered(monkeypatch):
    """The dummy format in the registry (the one line a new format adds), for one test."""
    monkeypatch.setitem(FORMATS, Int8PerChannelWeightOnly.name, Int8PerChannelWeightOnly())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    ckpt = make_tiny_gemma3(root / "ckpt", seed=1, sharp=True)
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:60_000])
    return root, ckpt, data


def _config(root, ckpt, data, name: str, **kw) -> BuildConfig:
    return BuildConfig.of(
        model=str(ckpt),
        quant="w8pc",
        block_size=8,
        max_seq_len=128,
        calib_data=str(data),
        calib_samples=4,
        calib_seq_len=64,
        eval_samples=2,
        weight_rounding="nearest",
        cache_dir=str(root / "cache"),
        output=str(root / name),
        **kw,
    )


def test_the_registry_holds_one_module_per_format():
    assert list(FORMATS) == ["none", "fp8", "int8", "int4", "nvfp4", "mxfp8", "int8_weight_only"]
    # the weight-only form: per module
    assert list(QUANTS) == ["none", "fp8", "int8", "int4", "nvfp4", "mxfp8"]
    assert WEIGHT_ONLY8 in FORMATS and WEIGHT_ONLY8 not in QUANTS
    for name, fmt in FORMATS.items():
        assert fmt.name == name and isinstance(fmt, QuantFormat)
        assert type(fmt).__module__ == f"llmc.compiler.quantize.formats.{name}"


def test_a_registered_format_is_a_build_choice_with_its_defaults_and_rules(registered):
    assert "w8pc" in QUANTS and list(QUANTS)[-1] == "w8pc"
    args = build_parser().parse_args(["build", "m", "--quant", "w8pc"])
    assert args.quant == "w8pc"
    config = BuildConfig.of(quant="w8pc")
    config.validate()
    spec = config.quant_spec()
    assert (spec.quant, spec.exclude, spec.weight_only8) == ("w8pc", ("*.down_proj",), ())
    assert config.calib_method == "max"
    with pytest.raises(BuildConfigError, match="w8pc needs sm90"):
        BuildConfig.of(quant="w8pc", arch="sm89").validate()
    BuildConfig.of(quant="w8pc", arch="sm90").validate()


def test_an_unregistered_format_is_refused():
    assert "w8pc" not in QUANTS
    with pytest.raises(BuildConfigError, match="--quant 'w8pc' is not one of none, fp8"):
        BuildConfig.of(quant="w8pc").validate()


def test_a_registered_format_builds_reports_serves_and_lowers_for_tensorrt(setup, registered):
    root, ckpt, data = setup
    result = build(_config(root, ckpt, data, "cpu"))
    m = read_manifest(result.engine_dir)
    assert m.quant == "w8pc"
    q = m.quantization
    assert q["excluded"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert q["counts"] == {"int8_per_channel_weight_only": len(q["modules"])} and q["modules"]
    assert q["fast_path"] == {}  # no fused kernel expected
    assert m.accuracy_report["top1_agreement"] > 0.5
    out = LLM(result.engine_dir).generate(["To be"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4

    # The GPU path: Q/DQ, TensorRT lowering and lint, then the portable stage (no TensorRT here).
    with pytest.raises(TensorRTUnavailableError):
        build(_config(root, ckpt, data, "sm90", arch="sm90"))
    stage = read_stage(root / "sm90")
    assert stage.quant == "w8pc" and stage.lint["errors"] == 0
    assert stage.quantization["counts"] == q["counts"]
