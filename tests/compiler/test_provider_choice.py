"""Choosing a CPU engine's execution provider: the rule as a pure function, the OpenVINO EP's
real availability on this host, and the build options that are refused before any work.

The tests that measure a built engine live beside the tiny engines in ``test_compile_tiny.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest

from llmc.compiler.backends.onnxruntime import provider_choice
from llmc.compiler.backends.onnxruntime.provider_choice import (
    ACCEPTED,
    PENDING,
    REJECTED,
    UNAVAILABLE,
    CandidateResult,
    ProviderSelection,
    candidates,
    choose,
    judge,
)
from llmc.compiler.backends.onnxruntime.provider_timing import max_relative_diff, probe_steps
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine.manifest import parse_manifest
from llmc.engine.provider import CPU_EP, HYBRID, OPENVINO_EP, OPENVINO_RUNTIME
from llmc.errors import BuildConfigError
from llmc.runtime.runners.execution_provider import openvino_cpu_devices
from llmc.runtime.runners.openvino_runner import openvino_available
from tests.engine.test_manifest import make_manifest

CPU_DEVICE = bool(openvino_cpu_devices()[0])
needs_no_openvino_device = pytest.mark.skipif(
    CPU_DEVICE, reason="the OpenVINO EP exposes a CPU device on this host"
)


def measured(provider: str, score: float, status: str = ACCEPTED, precision: str = "f32"):
    return CandidateResult(provider, precision, status, step_ms={"decode_1": score}, score_ms=score)


def test_fastest_accepted_candidate_wins():
    results = [measured(CPU_EP, 10.0), measured(OPENVINO_EP, 6.0)]
    assert choose(results).provider == OPENVINO_EP
    assert choose(results[::-1]).provider == OPENVINO_EP


def test_a_near_tie_keeps_the_earlier_candidate():
    # 9.6 ms is within the 5% margin of 10 ms: the CPU EP (first, no plugin) stays.
    assert choose([measured(CPU_EP, 10.0), measured(OPENVINO_EP, 9.6)]).provider == CPU_EP
    assert choose([measured(CPU_EP, 10.0), measured(OPENVINO_EP, 9.4)]).provider == OPENVINO_EP


def test_rejected_and_unavailable_candidates_never_win():
    results = [
        measured(CPU_EP, 10.0),
        measured(OPENVINO_EP, 1.0, status=REJECTED),
        CandidateResult(OPENVINO_EP, "bf16", UNAVAILABLE, "no CPU device"),
    ]
    assert choose(results).provider == CPU_EP
    with pytest.raises(ValueError, match="no accepted"):
        choose(results[1:])


def test_judge_rejects_logits_beyond_the_precisions_tolerance():
    pending = CandidateResult(OPENVINO_EP, "f32", PENDING)
    steps = {"prefill_128": 8.0, "decode_1": 1.0, "decode_16": 2.0}
    ok = judge(pending, steps, 2e-5)
    assert ok.status == ACCEPTED and ok.reason is None
    assert ok.score_ms == pytest.approx(math.cbrt(8.0 * 1.0 * 2.0))  # geometric mean
    bad = judge(pending, steps, 2e-3)
    assert bad.status == REJECTED and "disagree" in bad.reason and bad.tolerance == 1e-3
    bf16 = CandidateResult(OPENVINO_EP, "bf16", PENDING)
    assert judge(bf16, steps, 0.08).status == ACCEPTED  # bf16 error (DESIGN §9: up to ~0.1)
    assert judge(bf16, steps, 0.3).status == REJECTED
    assert judge(pending, steps, float("inf")).status == REJECTED


def test_max_relative_diff_is_relative_to_the_logits_scale():
    ref = {"a": np.array([[10.0, -20.0]], np.float32), "b": np.array([[1.0, 2.0]], np.float32)}
    same = {k: v.copy() for k, v in ref.items()}
    assert max_relative_diff(same, ref) == 0.0
    off = {"a": np.array([[11.0, -20.0]], np.float32), "b": ref["b"]}
    assert max_relative_diff(off, ref) == pytest.approx(1.0 / 20.0)
    nan = {"a": ref["a"], "b": np.array([[np.nan, 2.0]], np.float32)}
    assert max_relative_diff(nan, ref) == float("inf")


def test_selection_round_trips_through_the_manifest():
    selection = ProviderSelection(
        "auto",
        CPU_EP,
        "f32",
        [measured(CPU_EP, 3.0), CandidateResult(OPENVINO_EP, "f32", UNAVAILABLE, "no device")],
    )
    m = make_manifest()
    m.provider_selection = selection.to_dict()
    raw = json.dumps(asdict(m)).encode()
    assert ProviderSelection.from_dict(parse_manifest(raw, "m").provider_selection) == selection
    text = selection.format()
    assert "--execution-provider auto" in text and "unavailable: no device" in text
    # A manifest written before the field existed still loads, with no selection.
    old = asdict(make_manifest())
    del old["provider_selection"]
    assert parse_manifest(json.dumps(old).encode(), "m").provider_selection is None


def test_candidates_follow_dtype_and_mode():
    f32 = candidates("float32")
    assert [(c.provider, c.precision) for c in f32] == [(CPU_EP, "f32"), (OPENVINO_EP, "f32")]
    assert f32[0].status == PENDING
    quantized = [c.provider for c in candidates("float32", quantized=True)]
    assert quantized == [CPU_EP, OPENVINO_EP, HYBRID]
    assert [c.provider for c in candidates("float32", "cpu")] == [CPU_EP]
    bf16 = [(c.provider, c.precision) for c in candidates("bfloat16")]
    assert bf16 == [(OPENVINO_EP, "bf16"), (OPENVINO_RUNTIME, "bf16")]
    assert [c.provider for c in candidates("bfloat16", "openvino")] == [OPENVINO_EP]
    assert [c.provider for c in candidates("bfloat16", "openvino-runtime")] == [OPENVINO_RUNTIME]


@needs_no_openvino_device
def test_openvino_ep_is_unavailable_here_and_says_why():
    """These hosts (AMD EPYC): the plugin registers, yet lists no CPU device, and the reason
    names the vendor ONNX Runtime reports when it is not Intel (the plugin's filter)."""
    import onnxruntime as ort

    devices, reason = openvino_cpu_devices()
    assert devices == []
    try:
        import onnxruntime_ep_openvino  # noqa: F401

        assert "exposes no CPU device on this host" in reason
        vendor = next(d.device.vendor for d in ort.get_ep_devices() if d.ep_name == CPU_EP)
        if "Intel" not in vendor:
            assert reason.endswith(f"reports this CPU's vendor as {vendor})")
    except ImportError:
        assert "is not installed" in reason
    assert openvino_cpu_devices() == ([], reason)  # a second probe re-registers nothing
    ov = candidates("float32")[1]
    assert (ov.status, ov.reason) == (UNAVAILABLE, reason)


@needs_no_openvino_device
@pytest.mark.parametrize(
    "options",
    [{"execution_provider": "openvino"}, {"dtype": "bfloat16", "execution_provider": "openvino"}],
    ids=["forced", "bf16"],
)
def test_unrunnable_provider_is_refused_before_any_work(tmp_path, options):
    # The model path does not exist: the provider error must come before it is even resolved.
    model, out = str(tmp_path / "no-such-model"), str(tmp_path / "e")
    config = BuildConfig.of(model=model, output=out, **options)
    with pytest.raises(BuildConfigError, match="no provider can run") as raised:
        build(config)
    assert openvino_cpu_devices()[1] in str(raised.value)
    assert not (tmp_path / "e").exists()


@pytest.mark.skipif(openvino_available() is not None, reason=str(openvino_available()))
def test_auto_measures_the_hybrid_only_where_its_memory_fits_the_plan():
    # (engine bytes, headroom): the hybrid adds 5.5x the engine's bytes
    fits = candidates("float32", "auto", memory=(300, 2_000), quantized=True)[-1]
    assert (fits.provider, fits.status) == (HYBRID, PENDING)
    over = candidates("float32", "auto", (400_000_000, 2_000_000_000), quantized=True)[-1]
    assert (over.provider, over.status) == (HYBRID, UNAVAILABLE)
    assert "(~2.2 GB) would raise the build's peak RSS (headroom 2.0 GB)" in over.reason
    assert "--execution-provider cpu+openvino-runtime measures it anyway" in over.reason
    forced = candidates("float32", "cpu+openvino-runtime", memory=(3, 2))
    assert [(c.provider, c.status) for c in forced] == [(HYBRID, PENDING)]


def test_auto_measures_the_openvino_ep_only_where_its_memory_fits(monkeypatch):
    # As on an Intel host, where the EP has a CPU device: every provider runs here. The EP loads
    # 2.5x the engine's bytes; the CPU EP is measured whatever the headroom, and a bfloat16
    # engine (no CPU EP candidate) keeps its OpenVINO candidates.
    monkeypatch.setattr(provider_choice, "_unavailable", lambda name: None)
    over = {c.provider: c for c in candidates("float32", "auto", (1_000_000_000, 2_000_000_000))}
    assert over[CPU_EP].status == PENDING
    assert over[OPENVINO_EP].status == UNAVAILABLE and "(~2.5 GB)" in over[OPENVINO_EP].reason
    assert "--execution-provider openvino measures it anyway" in over[OPENVINO_EP].reason
    fits = candidates("float32", "auto", (500, 2_000))
    assert [(c.provider, c.status) for c in fits] == [(CPU_EP, PENDING), (OPENVINO_EP, PENDING)]
    bf16 = candidates("bfloat16", "auto", (1_000_000_000, 2_000))
    assert [c.status for c in bf16] == [PENDING, PENDING]


def test_a_quantized_engine_is_judged_with_the_quantized_tolerance():
    pending = CandidateResult(HYBRID, "f32", PENDING)
    assert judge(pending, {"decode_1": 1.0}, 0.075, quantized=True).status == ACCEPTED
    assert judge(pending, {"decode_1": 1.0}, 0.075).status == REJECTED
    assert judge(pending, {"decode_1": 1.0}, 0.2, quantized=True).status == REJECTED


def test_the_hybrid_is_refused_for_bfloat16_engines():
    with pytest.raises(BuildConfigError, match="runs the CPU EP's float32 engine"):
        BuildConfig.of(dtype="bfloat16", execution_provider="cpu+openvino-runtime").validate()


def test_openvino_runtime_is_refused_for_float32_engines():
    with pytest.raises(BuildConfigError, match="openvino-runtime computes in bf16"):
        BuildConfig.of(execution_provider="openvino-runtime").validate()


def test_cli_reports_the_refusal(tmp_path, capsys):
    from llmc.cli import main

    code = main(
        ["build", str(tmp_path / "m"), "--dtype", "bfloat16", "--execution-provider", "cpu"]
    )
    assert code == 2
    assert "--execution-provider cpu cannot run --dtype bfloat16" in capsys.readouterr().err


def test_build_config_option_is_validated_and_read_from_yaml(tmp_path):
    with pytest.raises(BuildConfigError, match="--execution-provider 'cuda' is not one of"):
        BuildConfig.from_sources(None, {"execution_provider": "cuda"})
    with pytest.raises(BuildConfigError, match="applies to cpu engines"):
        BuildConfig.from_sources(None, {"arch": "sm90", "execution_provider": "openvino"})
    yaml_file = tmp_path / "b.yaml"
    yaml_file.write_text("execution-provider: cpu\n")
    assert BuildConfig.from_sources(str(yaml_file), {}).target.execution_provider == "cpu"
    assert BuildConfig.from_sources(str(yaml_file), {"execution_provider": "auto"}).hash() == (
        BuildConfig().hash()  # the graph does not depend on it; the manifest records it
    )


def test_probe_steps_stay_within_the_engines_limits():
    probe = probe_steps(
        block_size=4, vocab_size=512, max_seq_len=64, max_num_tokens=2048, max_batch=8
    )
    assert list(probe.steps) == ["prefill_63", "decode_1", "decode_8"]
    decode = probe.steps["decode_8"]
    assert decode.positions.tolist() == [63] * 8 and decode.seq_lens.tolist() == [64] * 8
    # Sequence 0 owns blocks 0..15; the others share its 15 full blocks and own one each.
    assert decode.block_tables[0].tolist() == list(range(16))
    assert decode.block_tables[3].tolist() == [*range(15), 18]
    assert decode.slot_mapping.tolist() == [63, *((15 + i) * 4 + 3 for i in range(1, 8))]
    assert probe.num_blocks == 23
    assert int(probe.steps["prefill_63"].input_ids.min()) >= 3
    tiny = probe_steps(block_size=16, vocab_size=512, max_seq_len=8, max_num_tokens=4, max_batch=1)
    assert list(tiny.steps) == ["prefill_4", "decode_1"]


def test_the_chosen_hybrid_records_its_boundary_and_a_host_without_openvino_refuses_it():
    from dataclasses import replace

    from llmc.compiler.backends.onnxruntime.report import chosen_provider
    from llmc.engine.targets.cpu import check_provider_version
    from llmc.errors import EngineMismatchError
    from llmc.runtime.runners.hybrid_runner import MIN_OPENVINO_TOKENS

    hybrid = chosen_provider(ProviderSelection("auto", HYBRID, "f32", []))
    assert hybrid.min_large_tokens == MIN_OPENVINO_TOKENS
    assert chosen_provider(ProviderSelection("auto", CPU_EP, "f32", [])).min_large_tokens is None
    manifest = replace(
        make_manifest(),
        execution_provider=HYBRID,
        execution_provider_version="2026.4.1",
        execution_min_large_tokens=hybrid.min_large_tokens,
    )
    assert manifest.provider == hybrid
    check_provider_version(manifest, "2026.4.0")  # same major.minor: runs
    with pytest.raises(EngineMismatchError, match="pip install the matching openvino, or rebuild "
                       "the engine with --execution-provider cpu"):  # fmt: skip
        check_provider_version(manifest, None)
