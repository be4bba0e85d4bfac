"""ISA detection: verdicts come from executed probes; cpuid flags only pick what to probe."""

import shutil
import sys
from pathlib import Path

import pytest

from llmc.engine import isa
from llmc.engine.isa import HostIsa, detect_host_isa, isa_name, missing_features

FLAGS = isa._cpu_flags()
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
needs_x86 = pytest.mark.skipif(isa._machine() != "x86_64", reason="x86-64 probes")
SIGILL_COMMAND = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


@needs_gcc
@needs_x86
def test_detection_executes_probes_on_this_host():
    host = detect_host_isa()
    assert host.method == "executed"
    assert host.arch == "x86_64"
    assert list(host.features) == sorted(host.features)
    assert set(host.features) <= set(isa.FEATURES)
    if "avx2" in FLAGS:
        assert "avx2" in host.features
    # Nothing is claimed that cpuid does not advertise.
    for feature in host.features:
        for probe in isa._CANONICAL[feature]:
            assert isa._PROBE_FLAGS[probe] in FLAGS


@needs_gcc
@needs_x86
def test_amx_verdict_is_the_probes_and_a_refusal_is_explained():
    if "amx_tile" not in FLAGS:
        pytest.skip("/proc/cpuinfo does not advertise AMX")
    host = detect_host_isa()
    amx_notes = [note for note in host.notes if note.startswith("amx-")]
    # Advertised AMX is either executed, or left out with the probe's failure named.
    assert ("amx" in host.features) != bool(amx_notes)
    probe = str(isa._probe_binary())
    all_ran = all(isa.run_probe([probe, p]) is None for p in ("amx-tile", "amx-int8", "amx-bf16"))
    assert ("amx" in host.features) == all_ran


def test_a_probe_killed_by_sigill_makes_an_advertised_feature_absent():
    why = isa.run_probe(SIGILL_COMMAND)
    assert why == "its probe died with SIGILL"
    verdicts = {"avx2": None, "amx-tile": None, "amx-int8": why, "amx-bf16": None}
    host = isa._assemble("x86_64", verdicts, "executed", ())
    assert host.features == ("avx2",)


def test_avx512_needs_f_bw_and_vl_and_extensions_need_the_base():
    ran = dict.fromkeys(("avx2", "avx512f", "avx512bw", "avx512-vnni", "avx512-bf16"))
    assert isa._assemble("x86_64", {**ran, "avx512vl": "SIGILL"}, "executed", ()).features == (
        "avx2",
    )
    full = isa._assemble("x86_64", {**ran, "avx512vl": None}, "executed", ())
    assert full.features == ("avx2", "avx512", "avx512-bf16", "avx512-vnni")


@needs_x86
def test_without_gcc_falls_back_to_cpuid_flags_minus_amx(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached probe to reuse
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(isa.shutil, "which", lambda name: None)
    host = isa.detect_host_isa.__wrapped__()
    assert host.method == "cpuid-fallback"
    assert "amx" not in host.features
    assert "gcc not found" in host.notes[0]
    if "avx2" in FLAGS:
        assert "avx2" in host.features


@needs_gcc
def test_probe_binary_is_compiled_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = isa._probe_binary()
    assert first.parent == tmp_path / "llmc"
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no partial files left

    def no_compile(*args, **kwargs):
        raise AssertionError("recompiled a cached probe")

    monkeypatch.setattr(isa.subprocess, "run", no_compile)
    assert isa._probe_binary() == first


def test_cpu_flags_reads_x86_flags_and_arm_features(tmp_path: Path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile\n\nprocessor\t: 1\nflags\t: sse\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm\n")
    assert isa._cpu_flags(x86) == {"fpu", "avx2", "amx_tile"}
    assert isa._cpu_flags(arm) == {"fp", "asimd", "evtstrm"}
    assert isa._cpu_flags(tmp_path / "absent") == frozenset()


def test_name_is_short_and_readable():
    avx512 = ("avx2", "avx512", "avx512-bf16", "avx512-vnni")
    assert HostIsa("x86_64", avx512, "executed").name == "cpu-avx512-vnni-bf16"
    assert HostIsa("x86_64", ("avx2",), "executed").name == "cpu-avx2"
    assert isa_name(("amx", *avx512)) == "cpu-avx512-vnni-bf16-amx"
    assert isa_name(("neon",)) == "cpu-neon"
    assert isa_name(()) == "cpu-generic"


def test_missing_features_keeps_order_and_drops_duplicates():
    host = HostIsa("x86_64", ("avx2", "avx512"), "executed")
    required = ["avx512-bf16", "avx2", "amx", "avx512-bf16"]
    assert missing_features(required, host) == ["avx512-bf16", "amx"]
    assert missing_features(["avx2", "avx512"], host) == []
