"""``--accuracy-target``: the target's parsing, the order units leave the cheap format, the
search on made-up scores, and a tiny Gemma 3 built to a target through ``build``."""

from __future__ import annotations

import json

import pytest

from llmc.calibration.accuracy import AccuracyReport, pooled_report
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize.search import path_search
from llmc.compiler.quantize.search.accuracy_target import AccuracyTarget
from llmc.compiler.quantize.search.assignment import (
    Unit,
    assignment_of,
    make_units,
    upgrade_path,
)
from llmc.compiler.quantize.search.path_search import (
    BYTES_TOLERANCE,
    AccuracyTargetError,
    Resume,
    Screening,
    _screened,
    decision,
    search,
)
from llmc.compiler.quantize.search.recheck import (
    MAX_RECHECKS,
    EngineMissedTarget,
    check_engine_accuracy,
)
from llmc.engine.manifest import read_manifest
from llmc.errors import BuildConfigError
from tests.tiny_models import calibration_text, make_tiny_gemma3, quant_config

LADDER = ("fp8", "int8_weight_only", "none")


def _report(kl: float, top1: float = 0.9) -> AccuracyReport:
    return AccuracyReport("test", 1, 10, 10.0, 10.0 * (1 + kl), kl, kl, top1)


@pytest.mark.parametrize(
    ("text", "metric", "value"),
    [("top1=0.95", "top1", 0.95), ("kl=0.01", "kl", 0.01), ("ppl-change=0.02", "ppl_change", 0.02)],
)
def test_target_parses(text, metric, value):
    assert AccuracyTarget.parse(text) == AccuracyTarget(metric, value)


@pytest.mark.parametrize("text", ["top1", "top5=0.9", "top1=1.5", "top1=0", "kl=-1", "kl=abc"])
def test_bad_target_is_refused(text):
    with pytest.raises(BuildConfigError, match="--accuracy-target"):
        AccuracyTarget.parse(text)


def test_target_direction():
    top1, kl = AccuracyTarget("top1", 0.9), AccuracyTarget("kl", 0.01)
    assert top1.met(_report(0.5, top1=0.9)) and not top1.met(_report(0.0, top1=0.89))
    assert kl.met(_report(0.01)) and not kl.met(_report(0.011))


def _units() -> list[Unit]:
    # Three layers of 100 weights; fp8 costs 1 byte a weight, 8-bit weight-only 1.125, float 4.
    params = {f"model.layers.{i}.mlp.down_proj": 100 for i in range(3)}
    return make_units(params, dict.fromkeys(params, "fp8"), LADDER)


def test_units_group_layers_and_start_where_the_default_is():
    params = {"model.layers.0.a": 10, "model.layers.0.b": 20, "lm_head": 30}
    starts = {"model.layers.0.a": "fp8", "model.layers.0.b": "fp8", "lm_head": "int8_weight_only"}
    units = make_units(params, starts, LADDER)
    assert [(u.name, u.ladder) for u in units] == [
        ("model.layers.0", LADDER),
        ("lm_head", ("int8_weight_only", "none")),
    ]
    assert units[0].weight_bytes("fp8", 4.0) == 30.0
    assert units[0].weight_bytes("none", 4.0) == 120.0


def test_upgrade_path_takes_most_kl_per_byte_first():
    # Moving a layer fp8 -> w8 adds 12.5 bytes; -> float adds 300.
    sens = {
        "model.layers.0": {"fp8": 0.10, "int8_weight_only": 0.001},  # w8 removes 0.099
        "model.layers.1": {"fp8": 0.02, "int8_weight_only": 0.019},  # w8 removes 0.001
        "model.layers.2": {"fp8": 0.05, "int8_weight_only": 0.0},  # w8 removes 0.05
    }
    path = upgrade_path(_units(), sens, 4.0)
    steps = [(m.unit, m.new) for m in path]
    # Per byte: layer 0 to w8 (0.0079), layer 2 to w8 (0.004), layer 1 to w8 (0.00008); then
    # float: layer 1 (0.019/287.5), layer 0 (0.001/287.5); layer 2's float removes nothing.
    assert steps == [
        ("model.layers.0", "int8_weight_only"),
        ("model.layers.2", "int8_weight_only"),
        ("model.layers.1", "int8_weight_only"),
        ("model.layers.1", "none"),
        ("model.layers.0", "none"),
        ("model.layers.2", "none"),
    ]
    assert path[0].weight_bytes == pytest.approx(300 + 12.5)
    assert path[-1].weight_bytes == pytest.approx(1200)


class _Additive:
    """Scores as if each unit's KL added up (the search's own assumption, made exact)."""

    def __init__(self, kl: dict[str, dict[str, float]]):
        self.kl, self.heldout_calls, self.sensitivity_calls = kl, 0, 0

    def total(self, assignment) -> float:
        from llmc.compiler.quantize.search.assignment import unit_name

        rungs = {unit_name(m): f for m, f in assignment}
        return sum(self.kl[u].get(r, 0.0) for u, r in rungs.items())

    def sensitivity(self, assignments) -> list[float]:
        self.sensitivity_calls += len(assignments)
        return [self.total(a) for a in assignments]

    def heldout(self, assignment) -> AccuracyReport:
        self.heldout_calls += 1
        return _report(self.total(assignment))


#: Three layers' KL at each rung (the search's additive model made exact).
THREE_LAYERS = {
    "model.layers.0": {"fp8": 0.10, "int8_weight_only": 0.001},
    "model.layers.1": {"fp8": 0.02, "int8_weight_only": 0.019},
    "model.layers.2": {"fp8": 0.05, "int8_weight_only": 0.0},
}


def test_search_finds_the_cheapest_prefix_that_keeps_the_target():
    kl = THREE_LAYERS
    scores = _Additive(kl)
    # Flat: 0.17. After layer 0 -> w8: 0.071; after layer 2 -> w8: 0.021; after layer 1 -> w8:
    # 0.020. A target of 0.0205 needs three moves.
    result = search(AccuracyTarget("kl", 0.0205), _units(), 4.0, scores.sensitivity, scores.heldout)
    assert result.rungs == dict.fromkeys(kl, "int8_weight_only")
    assert result.report.mean_kl == pytest.approx(0.020)
    assert result.flat.mean_kl == pytest.approx(0.17)
    assert scores.sensitivity_calls == 6
    assert scores.heldout_calls <= 1 + 4  # flat, then a binary search over 5 candidates
    result = search(AccuracyTarget("kl", 0.05), _units(), 4.0, scores.sensitivity, scores.heldout)
    assert result.rungs == {
        "model.layers.0": "int8_weight_only",
        "model.layers.1": "fp8",
        "model.layers.2": "int8_weight_only",
    }


class _Screened(_Additive):
    """``_Additive`` whose held-out windows are 16, their KLs the total times 1 +- ``spread``
    (alternating); a screening gives the first few, each its own report."""

    def __init__(self, kl, spread: float):
        super().__init__(kl)
        self.spread, self.screened = spread, []

    def first(self, assignment, count: int) -> list[AccuracyReport]:
        self.screened.append(count)
        total = self.total(assignment)
        return [_report(total * (1 + self.spread * (-1) ** i)) for i in range(count)]

    def screening(self) -> Screening:
        return Screening(self.first, 16)


def test_screening_decides_far_scorings_and_finds_the_same_assignment():
    """Scorings far from the target on either side are decided on their first windows, those
    near it take the full scoring; the search ends where the unscreened one does."""
    target = AccuracyTarget("kl", 0.0205)
    unscreened = _Additive(THREE_LAYERS)
    plain = search(target, _units(), 4.0, unscreened.sensitivity, unscreened.heldout)
    tight = _Screened(THREE_LAYERS, spread=0.01)
    result = search(
        target, _units(), 4.0, tight.sensitivity, tight.heldout, screen=tight.screening()
    )
    assert result.rungs == plain.rungs
    windows = {k: n for k, _, _, n in result.scored}
    assert windows[0] == 4  # the flat KL 0.17 misses 0.0205 by far
    assert windows[5] == 4  # the most accurate one (KL 0.0) keeps it by far
    # the chosen KL 0.020 is 2.4% under the target, 3 standard errors are 1.3% at 4 windows
    assert windows[result.moves] == 4 and result.report.mean_kl == pytest.approx(0.020)
    assert tight.heldout_calls == 0
    # A window spread of 10% decides the far ones at 4 windows and the near ones at none.
    wide = _Screened(THREE_LAYERS, spread=0.1)
    again = search(target, _units(), 4.0, wide.sensitivity, wide.heldout, screen=wide.screening())
    windows = {k: n for k, _, _, n in again.scored}
    assert again.rungs == plain.rungs and windows[0] == 4 and windows[again.moves] == 1
    assert wide.heldout_calls == sum(n == 1 for n in windows.values()) > 0
    # the near ones miss or keep by less than 8 windows could decide: from 4 windows to all,
    # or to all at once where their bracket's ends made them expected near (one of them here)
    assert wide.screened.count(8) == 0 and wide.screened == [4] * (len(windows) - 1)


class _Noisy(_Additive):
    """Top-1 agreement 1 - 2 x the additive KL, each of 16 windows 0.05 off it (alternating
    sign); a screening gives the first few, as ``_Screened`` does."""

    def __init__(self, kl):
        super().__init__(kl)
        self.screened: list[int] = []

    def _window(self, assignment, i: int) -> AccuracyReport:
        return _report(0.0, top1=1 - 2 * self.total(assignment) + 0.05 * (-1) ** i)

    def first(self, assignment, count: int) -> list[AccuracyReport]:
        self.screened.append(count)
        return [self._window(assignment, i) for i in range(count)]

    def heldout(self, assignment) -> AccuracyReport:
        self.heldout_calls += 1
        return pooled_report([self._window(assignment, i) for i in range(16)], "test")


def test_a_scoring_expected_near_the_target_takes_every_window_at_once(monkeypatch):
    """Bisection's scorings between two scored ends expected within a 4-window screening's
    error of the target skip the screening (each stage a run of its own), and the search ends
    where it does with every scoring screened first."""
    params = {f"model.layers.{i}.mlp.down_proj": 100 for i in range(18)}
    units = make_units(params, dict.fromkeys(params, "fp8"), LADDER)
    fp8 = [0.002 + 0.001 * ((7 * i) % 18) for i in range(18)]  # shuffled, 0.002-0.019
    kl = {f"model.layers.{i}": {"fp8": v, "int8_weight_only": v / 10} for i, v in enumerate(fp8)}
    target = AccuracyTarget("top1", 0.8)
    noisy = _Noisy(kl)
    result = search(
        target, units, 4.0, noisy.sensitivity, noisy.heldout,
        screen=Screening(noisy.first, 16),
    )  # fmt: skip
    monkeypatch.setattr(path_search, "_expected_margin", lambda *a: None)
    plain = _Noisy(kl)
    again = search(
        target, units, 4.0, plain.sensitivity, plain.heldout,
        screen=Screening(plain.first, 16),
    )  # fmt: skip
    assert result.moves == again.moves and result.scored == again.scored
    assert noisy.heldout_calls == plain.heldout_calls > 0
    assert len(noisy.screened) < len(plain.screened)


def test_a_screening_stage_that_could_decide_is_run():
    """0.94 from 4 windows spread 0.0115 misses 0.95 by less than 3 standard errors (0.015);
    8 windows of that spread could decide (0.0087): the 8-window stage is run, and decides."""
    values = [0.93, 0.95, 0.93, 0.95] * 4

    def first(assignment, count):
        return [_report(0.0, top1=v) for v in values[:count]]

    screening = Screening(first, 16)
    report = _screened(AccuracyTarget("top1", 0.95), None, screening)(())
    assert report.num_windows == 8 and report.top1_agreement == pytest.approx(0.94)


def test_decision_reads_the_spread_and_the_share_of_windows_scored():
    top1 = AccuracyTarget("top1", 0.95)
    near = [_report(0.0, top1=v) for v in (0.96, 0.94, 0.97, 0.95)]  # 0.955, se 0.0065
    assert decision(top1, near, 16) is None
    assert decision(top1, [_report(0.0, top1=v) for v in (0.91, 0.92, 0.90, 0.91)], 16) is False
    assert decision(top1, [_report(0.0, top1=v) for v in (0.99, 0.98, 0.99, 0.98)], 16) is True
    # 0.955 against 0.94: 3 standard errors are 0.0168 with 4 of 16 windows scored (undecided),
    # 0.0087 with 4 of 5 (the unscored window can move the mean less): kept
    lower = AccuracyTarget("top1", 0.94)
    assert decision(lower, near, 16) is None and decision(lower, near, 5) is True
    assert decision(top1, near, 4) is True  # every window scored: no error left
    assert decision(top1, near[:1], 16) is None  # one window: no spread to read


def test_search_stops_when_the_cheapest_keep_is_pinned_to_within_the_byte_tolerance(monkeypatch):
    """18 layers whose moves to 8-bit weight-only add 0.4% of the flat bytes each: the search
    ends with a keep at most ``BYTES_TOLERANCE`` of the flat bytes above the cheapest one, in
    fewer scorings than pinning that one down takes."""
    params = {f"model.layers.{i}.mlp.down_proj": 100 for i in range(18)}
    units = make_units(params, dict.fromkeys(params, "fp8"), LADDER)
    kl = {
        f"model.layers.{i}": {"fp8": 0.01 + 0.001 * i, "int8_weight_only": 0.0} for i in range(18)
    }
    target = AccuracyTarget("kl", 0.15)
    path = upgrade_path(units, kl, 4.0)
    additive = _Additive(kl)
    first = next(
        k
        for k, m in enumerate(path, 1)
        if target.met(additive.heldout(assignment_of(units, m.rungs)))
    )
    scores = _Additive(kl)
    result = search(target, units, 4.0, scores.sensitivity, scores.heldout)
    assert result.report.mean_kl <= 0.15 and result.moves > first  # the first keep not scored
    over = result.weight_bytes[0] - path[first - 1].weight_bytes
    assert over <= BYTES_TOLERANCE * result.weight_bytes[1]
    monkeypatch.setattr(path_search, "BYTES_TOLERANCE", 0.0)
    pinned = _Additive(kl)
    assert search(target, units, 4.0, pinned.sensitivity, pinned.heldout).moves == first
    assert pinned.heldout_calls > scores.heldout_calls


def test_search_keeps_the_flat_assignment_when_it_meets_the_target():
    scores = _Additive({f"model.layers.{i}": {"fp8": 0.01} for i in range(3)})
    result = search(AccuracyTarget("kl", 0.05), _units(), 4.0, scores.sensitivity, scores.heldout)
    assert set(result.rungs.values()) == {"fp8"}
    assert scores.sensitivity_calls == 0 and scores.heldout_calls == 1


def test_search_fails_naming_the_best_reached():
    kl = {f"model.layers.{i}": {"fp8": 0.1, "int8_weight_only": 0.05} for i in range(3)}
    scores = _Additive(kl)
    with pytest.raises(AccuracyTargetError, match=r"reaches kl 0\.05.*flat --quant fp8 0\.3"):
        search(AccuracyTarget("kl", 0.01), _units(), 4.0, scores.sensitivity, scores.heldout)


def test_a_resumed_search_goes_past_the_missed_engine_without_scoring_sensitivities():
    kl = THREE_LAYERS
    first = _Additive(kl)
    target = AccuracyTarget("kl", 0.075)
    result = search(target, _units(), 4.0, first.sensitivity, first.heldout)
    assert (result.moves, result.path_moves) == (1, 5)  # 0.071 after layer 0 -> w8
    # Its engine gave KL 0.08 (its kernels lose 0.009): the search goes on past move 1 for
    # KL <= 0.066, which move 2 (0.021) keeps, and scores no sensitivity again.
    missed = {"moves": 1, "search_value": 0.071, "engine_value": 0.08}
    resume = Resume(1, target.tightened(0.009), result.sensitivity, (missed,))
    again = _Additive(kl)
    resumed = search(target, _units(), 4.0, again.sensitivity, again.heldout, resume=resume)
    assert again.sensitivity_calls == 0
    assert resumed.moves == 2 and resumed.report.mean_kl == pytest.approx(0.021)
    assert resumed.target == AccuracyTarget("kl", 0.066)
    assert resumed.to_dict()["rechecks"] == [missed]
    # Past the last candidate there is nothing to resume to: only float would keep it.
    last = Resume(5, target, result.sensitivity, (missed,))
    with pytest.raises(AccuracyTargetError, match="only float keeps it"):
        search(target, _units(), 4.0, again.sensitivity, again.heldout, resume=last)


def test_an_engine_that_misses_resumes_the_search_a_bounded_number_of_times():
    target = AccuracyTarget("top1", 0.95)
    record = {"value": 0.955, "moves": 4, "sensitivity_kl": {"u": {"fp8": 0.1}}, "rechecks": []}
    check_engine_accuracy(target, _report(0.01, top1=0.951), record, 0)  # kept: returns
    with pytest.raises(EngineMissedTarget, match="searching past 4 moves for top1 >= 0.96") as e:
        check_engine_accuracy(target, _report(0.01, top1=0.945), record, 0)
    resume = e.value.resume
    assert resume.moves == 4 and resume.target.value == pytest.approx(0.96)  # 0.95 + 0.01
    assert resume.missed == ({"moves": 4, "search_value": 0.955, "engine_value": 0.945},)
    # The largest loss seen so far is kept on top of the target.
    record2 = {"value": 0.955, "moves": 6, "sensitivity_kl": {}, "rechecks": list(resume.missed)}
    with pytest.raises(EngineMissedTarget) as e2:
        check_engine_accuracy(target, _report(0.01, top1=0.949), record2, 1)  # loses 0.006
    assert e2.value.resume.target.value == pytest.approx(0.96)
    with pytest.raises(EngineMissedTarget, match="after 2 re-checks") as e3:
        check_engine_accuracy(target, _report(0.01, top1=0.9), record2, MAX_RECHECKS)
    assert e3.value.resume is None and isinstance(e3.value, AccuracyTargetError)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("target")
    return root, make_tiny_gemma3(root / "ckpt", seed=1, sharp=True), calibration_text(root)


def _config(root, ckpt, data, name, **kw) -> BuildConfig:
    return quant_config(ckpt, root, data, "fp8", name, eval_samples=4, **kw)


def _flat_kl(root, ckpt, data, name: str, **kw) -> float:
    """The mean KL of the flat fp8 engine ``name`` (built once per module)."""
    if not (root / name / "manifest.json").exists():
        build(_config(root, ckpt, data, name, **kw))
    return read_manifest(root / name).accuracy_report["mean_kl"]


def test_tiny_build_meets_a_target_the_flat_format_misses(tiny):
    root, ckpt, data = tiny
    flat_kl = _flat_kl(root, ckpt, data, "flat")
    target = flat_kl / 4
    result = build(_config(root, ckpt, data, "targeted", accuracy_target=f"kl={target}"))
    m = read_manifest(result.engine_dir)
    assert m.accuracy_report["mean_kl"] <= target
    record = m.quantization["spec"]["accuracy_target"]
    assert record["flat_report"]["mean_kl"] > target  # the search saw the flat one miss it
    # It scored the flat assignment as the flat engine computes (its attention numerics too).
    assert record["flat_report"]["mean_kl"] == pytest.approx(flat_kl, rel=0.05)
    rungs = record["rungs"]
    assert set(rungs) == {"model.layers.0", "model.layers.1", "lm_head"}
    assert any(r != "fp8" for u, r in rungs.items() if u != "lm_head")
    # The engine's modules carry the formats the search chose.
    labels = {"fp8": "fp8_w8a8", "int8_weight_only": "int8_weight_only"}
    for module, entry in m.quantization["modules"].items():
        unit = "lm_head" if module == "lm_head" else ".".join(module.split(".")[:3])
        assert entry["format"] == labels[rungs[unit]], module
    float_units = {u for u, r in rungs.items() if r == "none"}
    excluded = {".".join(x.split(".")[:3]) for x in m.quantization["excluded"]}
    assert float_units <= excluded
    assert "--accuracy-target kl <=" in result.format()
    json.dumps(record)  # the manifest's record is plain JSON


def test_an_engine_that_misses_the_target_is_rebuilt_further_along_the_path(tiny):
    """The search does not model a quantized KV cache; the engine's report does. A target
    between the flat engine's KL without and with an int8 KV cache is kept by the flat
    assignment in the search and missed by its engine: the build searches again past it, for
    the target tightened by that loss, and ends with an engine that keeps the target."""
    root, ckpt, data = tiny
    plain, with_kv = (
        _flat_kl(root, ckpt, data, "flat"),
        _flat_kl(root, ckpt, data, "flat-kv", kv_cache_dtype="int8"),
    )
    assert with_kv > plain  # the int8 KV cache loses accuracy the search cannot see
    target = (plain + with_kv) / 2
    config = _config(
        root, ckpt, data, "rechecked", kv_cache_dtype="int8", accuracy_target=f"kl={target}"
    )
    m = read_manifest(build(config).engine_dir)
    assert m.accuracy_report["mean_kl"] <= target
    record = m.quantization["spec"]["accuracy_target"]
    (missed,) = record["rechecks"]
    assert missed["moves"] == 0 and missed["search_value"] <= target < missed["engine_value"]
    assert record["moves"] > 0
    loss = missed["engine_value"] - missed["search_value"]
    assert record["target"] == str(AccuracyTarget("kl", target - loss))


def test_tiny_build_fails_cleanly_when_only_float_would_do(tiny):
    root, ckpt, data = tiny
    with pytest.raises(AccuracyTargetError, match="not kept by any assignment"):
        build(_config(root, ckpt, data, "impossible", accuracy_target="kl=1e-12"))
    assert not (root / "impossible").exists()


def test_accuracy_target_needs_a_quant():
    with pytest.raises(BuildConfigError, match="--accuracy-target"):
        BuildConfig.of(model="x", quant="none", accuracy_target="top1=0.9").validate()


def test_gpu_stage_records_a_mixed_assignment_that_passes_the_lint(tiny):
    """sm100, nvfp4 with its fp8 and 8-bit fallbacks: the search runs on the cpu emulation, the
    stage records it, and TensorRT's lint takes the mixed graph."""
    from llmc.compiler.backends.tensorrt.finish import TensorRTUnavailableError
    from llmc.engine.stage import read_stage

    root, ckpt, data = tiny

    def stage_record(name: str, target: str) -> dict:
        with pytest.raises(TensorRTUnavailableError):
            build(
                quant_config(
                    ckpt, root, data, "nvfp4", name, arch="sm100", eval_samples=4,
                    accuracy_target=target,
                )
            )  # fmt: skip
        return read_stage(root / name).quantization["spec"]["accuracy_target"]

    # A target any assignment keeps: the search stops at the flat one and records its KL.
    flat = stage_record("nvfp4-flat", "kl=10")
    assert set(flat["rungs"].values()) == {"nvfp4", "int8_weight_only"}
    flat_kl = flat["flat_value"]
    record = stage_record("nvfp4-target", f"kl={flat_kl / 4}")
    out = root / "nvfp4-target"
    assert read_stage(out).lint["errors"] == 0
    assert record["value"] <= flat_kl / 4 < flat_kl == pytest.approx(record["flat_value"])
    assert set(record["rungs"].values()) <= {"nvfp4", "fp8", "int8_weight_only", "none"}
    assert any(r != "nvfp4" for u, r in record["rungs"].items() if u != "lm_head")
