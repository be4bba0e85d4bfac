"""The default recipe of each format is the one the recorded accuracy-versus-speed front names.

The test reads the table the compiler reads (``llmc/compiler/quantize/front.json``, regenerated
by ``benchmarks/bench_recipe_front.py``) with its own reading of the rule: within a host and
model, a recipe another one beats or ties on mean KL, S1 decode and S16 throughput and both
TTFTs (and beats on one) is off the front; of the recipes left whose mean KL is within twice the
most accurate one's, the default is the fastest (geometric mean of the throughputs and the
inverse TTFTs).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from importlib import resources

import pytest

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.front import Front, default_recipe
from llmc.errors import BuildConfigError

ARCH_OF_FAMILY = {"cpu": "cpu", "gpu": "sm89"}


def _table() -> dict:
    text = resources.files("llmc.compiler.quantize").joinpath("front.json").read_text()
    return json.loads(text)


def _front_recipes(rows: list[dict]) -> set[str]:
    """The recipes no row of the same host and model dominates (the test's own reading)."""

    def beats(a: dict, b: dict) -> bool:
        lower = ("mean_kl", "s1_ttft_ms", "s16_mean_ttft_ms")
        higher = ("s1_decode_tok_s", "s16_total_tok_s")
        ge = all(a[k] <= b[k] for k in lower) and all(a[k] >= b[k] for k in higher)
        gt = any(a[k] < b[k] for k in lower) or any(a[k] > b[k] for k in higher)
        return ge and gt

    same = lambda a, b: (a["host"], a["model"]) == (b["host"], b["model"])  # noqa: E731
    return {b["recipe"] for b in rows} - {
        b["recipe"] for b in rows for a in rows if same(a, b) and beats(a, b)
    }


def _cases() -> list[tuple[str, str]]:
    table = _table()
    keys = {(m["family"], m["quant"]) for m in table["measurements"]}
    keys |= {(r["family"], r["quant"]) for r in table["by_arithmetic"]}
    return sorted(keys)


def test_the_table_names_only_registered_formats_and_recipes():
    table = _table()
    for row in table["measurements"] + table["by_arithmetic"]:
        assert row["recipe"] in [r.name for r in FORMATS[row["quant"]].recipe_list()], row


@pytest.mark.parametrize("family,quant", _cases())
def test_the_default_recipe_is_the_one_the_recorded_front_names(family, quant):
    table = _table()
    rows = [m for m in table["measurements"] if (m["family"], m["quant"]) == (family, quant)]
    config = BuildConfig.of(quant=quant, arch=ARCH_OF_FAMILY[family])
    config.validate()
    chosen = config.quantization.recipe
    if not rows:
        by = {(r["family"], r["quant"]): r["recipe"] for r in table["by_arithmetic"]}
        assert chosen == by[(family, quant)]
        return
    front = _front_recipes(rows)
    assert chosen in front, (chosen, front)
    mine = [m for m in rows if m["recipe"] == chosen]
    kl = {r: statistics.fmean(m["mean_kl"] for m in rows if m["recipe"] == r) for r in front}
    assert kl[chosen] <= 2 * min(kl.values())

    def speed(recipe: str) -> float:
        runs = [m for m in rows if m["recipe"] == recipe]
        values = [m[k] for m in runs for k in ("s1_decode_tok_s", "s16_total_tok_s")]
        values += [1000 / m[k] for m in runs for k in ("s1_ttft_ms", "s16_mean_ttft_ms")]
        return statistics.geometric_mean(values)

    assert mine and all(speed(chosen) >= speed(r) for r in front if kl[r] <= 2 * min(kl.values()))


def _row(host: str, recipe: str, kl: float, s1: float, s16: float, ttft: float = 500) -> dict:
    return {
        "family": "cpu", "host": host, "model": "m", "quant": "int8", "recipe": recipe,
        "mean_kl": kl, "top1": 0.9, "s1_decode_tok_s": s1, "s16_total_tok_s": s16,
        "s1_ttft_ms": ttft, "s16_mean_ttft_ms": 10 * ttft,
    }  # fmt: skip


def _default(rows: list[dict]) -> str:
    front = Front.from_dict({"measurements": rows, "by_arithmetic": []})
    return default_recipe(FORMATS["int8"], "cpu", front)


def test_a_recipe_dominated_on_one_host_is_never_the_default():
    # weight-only is the more accurate on average, but smoothquant beats it everywhere on b
    rows = [
        _row("a", "weight-only", 0.001, 40, 200),
        _row("a", "smoothquant", 0.030, 50, 300),
        _row("b", "weight-only", 0.020, 40, 200),
        _row("b", "smoothquant", 0.015, 45, 250),
    ]
    assert _default(rows) == "smoothquant"
    # as fast as smoothquant on b, it is on the front, the only one of its accuracy class
    rows[2] = _row("b", "weight-only", 0.020, 45, 260)
    assert _default(rows) == "weight-only"


def test_of_two_recipes_of_one_accuracy_class_the_faster_is_the_default():
    rows = [_row("a", "weight-only", 0.010, 40, 200), _row("a", "smoothquant", 0.019, 45, 300)]
    assert _default(rows) == "smoothquant"  # KL within 2x, faster in both scenarios
    rows[1] = _row("a", "smoothquant", 0.021, 45, 300)
    assert _default(rows) == "weight-only"  # past 2x: accuracy first
    # the TTFTs count: within 2x, smoothquant's 3x slower prefill outweighs its throughput
    rows[1] = _row("a", "smoothquant", 0.019, 45, 300, ttft=1500)
    assert _default(rows) == "weight-only"


def test_without_a_measurement_the_arithmetic_choice_then_the_first_recipe():
    arithmetic = [{"family": "gpu", "quant": "int8", "recipe": "weight-only", "why": "test"}]
    front = Front.from_dict({"measurements": [], "by_arithmetic": arithmetic})
    assert default_recipe(FORMATS["int8"], "sm89", front) == "weight-only"
    assert default_recipe(FORMATS["int8"], "cpu", front) == "smoothquant"  # the first
    assert default_recipe(FORMATS["fp8"], "sm89", front) == "default"  # one recipe


def test_an_explicit_recipe_wins_and_an_unknown_one_is_refused_with_the_known_ones():
    config = BuildConfig.of(quant="int8", recipe="weight-only", arch="cpu")
    config.validate()
    spec = config.quant_spec()
    assert (spec.weight_only8, spec.exclude, spec.weight_only8_block_size) == (("*",), (), 32)
    smooth = BuildConfig.of(quant="int8", recipe="smoothquant", weight_only8_block_size=128)
    assert smooth.quant_spec().weight_only8_block_size == 128
    assert smooth.quant_spec().exclude == ("*.down_proj",)
    assert smooth.calib_method == "percentile"
    with pytest.raises(BuildConfigError, match="its recipes: smoothquant, weight-only"):
        BuildConfig.of(quant="int8", recipe="awq").validate()
    # a config replaced to another format with its recipe unset (a draft engine's) resolves
    # that format's recipe
    q = dataclasses.replace(config.quantization, quant="int4", recipe=None)
    draft = dataclasses.replace(config, quantization=q)
    assert draft.quantization.recipe == default_recipe(FORMATS["int4"], "cpu")
