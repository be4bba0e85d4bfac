"""Quantization defaults and the text sources of calibration and the accuracy report."""

from __future__ import annotations

import fnmatch

import pytest

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.texts import TextSource
from llmc.errors import BuildConfigError


def test_text_sources_describe_file_part_or_sampling_seed(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("some words " * 10)
    assert TextSource(str(data), "calibration", 0).describe() == f"{data} (first 80%)"
    assert TextSource(str(data), "heldout", 1).describe() == f"{data} (last 20%)"
    # no file: the label says which seed the model sampled with (was an UnboundLocalError)
    assert TextSource(None, "heldout", 1).describe() == "sampled from the model (seed 1)"


def _recipes(quant: str) -> list[str]:
    return [r.name for r in FORMATS[quant].recipe_list()]


def test_vocabulary_projection_is_never_float_in_any_recipe():
    for quant in ("fp8", "int8", "int4"):
        for recipe in _recipes(quant):
            spec = BuildConfig.of(quant=quant, recipe=recipe).quant_spec()
            assert "lm_head" not in spec.exclude
            assert any(fnmatch.fnmatchcase("lm_head", p) for p in spec.weight_only8)
    sq = dict(quant="int8", recipe="smoothquant")
    assert BuildConfig.of(quant="fp8").quant_spec().weight_only8 == ("lm_head",)
    assert BuildConfig.of(**sq).quant_spec().weight_only8 == ("lm_head",)  # 8-bit, not float32
    # smoothquant: '' gives the W8A8 projection back; --exclude can still keep it float32
    assert "lm_head" not in BuildConfig.of(**sq, weight_only8="").quant_spec().weight_only8
    assert BuildConfig.of(**sq, exclude="lm_head").quant_spec().exclude == ("lm_head",)


def test_int4_awq_down8_keeps_down_proj_8bit_and_weight_only8_overrides_it():
    int4 = dict(quant="int4", recipe="awq-down8")
    assert BuildConfig.of(**int4).quant_spec().weight_only8 == ("lm_head", "*.down_proj")
    assert BuildConfig.of(**int4, weight_only8="lm_head").quant_spec().weight_only8 == ("lm_head",)
    assert BuildConfig.of(quant="int4", recipe="awq").quant_spec().weight_only8 == ("lm_head",)


def test_smoothquant_keeps_down_proj_float32_and_exclude_overrides_it():
    sq = dict(quant="int8", recipe="smoothquant")
    assert BuildConfig.of(**sq).quant_spec().exclude == ("*.down_proj",)
    assert BuildConfig.of(**sq, exclude="").quant_spec().exclude == ()
    for quant in ("fp8", "int4"):
        assert BuildConfig.of(quant=quant).quant_spec().exclude == ()
    assert BuildConfig.of(quant="int8", recipe="weight-only").quant_spec().exclude == ()


def test_smoothquant_alpha_grid_parses_and_refuses_bad_values():
    assert BuildConfig.of(quant="int8").quantization.smoothquant_alphas == ()
    assert BuildConfig.of(smoothquant_alpha_grid="auto").quantization.smoothquant_alphas[-1] == 1.0
    assert len(BuildConfig.of(smoothquant_alpha_grid="auto").quantization.smoothquant_alphas) == 11
    assert BuildConfig.of(smoothquant_alpha_grid="0.3, 0.9").quantization.smoothquant_alphas == (
        0.3,
        0.9,
    )
    assert BuildConfig.of(
        quant="int8", smoothquant_alpha_grid="0.2"
    ).quant_spec().smoothquant_alphas == (0.2,)
    for bad in ("1.5", "x"):
        with pytest.raises(BuildConfigError, match="smoothquant-alpha-grid"):
            BuildConfig.of(quant="int8", smoothquant_alpha_grid=bad).validate()
