"""``llmc verify`` on tiny engines: a float32 engine passes every segment; an engine whose
weights are not its checkpoint's fails the logits comparison; bad inputs fail before work."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from llmc.calibration.accuracy import AccuracyReport
from llmc.calibration.data import CalibrationDataError
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.verify.verify import VerifyConfig, VerifyError, result_tables, verify_engine
from llmc.engine.manifest import read_manifest, write_manifest
from llmc.engine.plan import load_plan
from llmc.errors import ModelSourceError
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3, make_tiny_llama

FAST = {"windows": 2, "seq_len": 24}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A float32 engine of a tiny Gemma 3, and a "corrupt" engine: built from the same
    architecture with another seed, its manifest claiming the first checkpoint."""
    root = tmp_path_factory.mktemp("verify")
    ckpts, dirs = {}, {}
    for seed in (0, 1):
        ckpts[seed] = make_tiny_gemma3(root / f"ckpt{seed}", seed=seed, sharp=True)
        dirs[seed] = root / f"engine{seed}"
        build(
            BuildConfig.of(
                model=str(ckpts[seed]), block_size=4, max_seq_len=64, output=str(dirs[seed])
            )
        )
    good = read_manifest(dirs[0])
    bad = read_manifest(dirs[1])
    write_manifest(
        dataclasses.replace(bad, source=good.source, checkpoint_digest=good.checkpoint_digest),
        dirs[1],
    )
    return ckpts, dirs[0], dirs[1]


def test_float32_engine_passes_every_segment(engines, tmp_path):
    """The build's report names a data file that still exists: verify scores its held-out part."""
    _, good, _ = engines
    engine = tmp_path / "engine"
    shutil.copytree(good, engine)
    m = read_manifest(engine)
    stored = AccuracyReport(str(SHAKESPEARE.resolve()), 1, 23, 500.0, 500.0, 0.0, 0.0, 1.0)
    anchor = AccuracyReport(stored.data, 1, 23, 500.0, 510.0, 0.02, 0.125, 0.75)
    record = {"name": "rtn", "label": "round-to-nearest", "report": anchor.to_dict()}
    quantization = {"spec": {"anchor": record}}
    write_manifest(
        dataclasses.replace(m, accuracy_report=stored.to_dict(), quantization=quantization),
        engine,
    )

    result = verify_engine(engine, VerifyConfig(**FAST))
    assert result.passed
    assert len(result.segments) == 3  # 2 layers: segment, plugin, segment, plugin, segment
    assert result.logits_segment == 2
    for s in result.segments:
        assert s.passed and s.note is None and s.outputs, s
        assert s.max_abs_error < 1e-4
    assert result.stored_accuracy == stored
    assert result.anchor == record
    printed = "\n".join(str(part) for part in result_tables(result))
    assert "round-to-nearest" in printed and "75.00%" in printed and "0.125" in printed
    report = result.accuracy
    assert report.data == str(SHAKESPEARE.resolve())
    assert (report.num_windows, report.num_tokens) == (2, 46)
    assert abs(report.mean_kl) < 1e-9 and report.top1_agreement == 1.0
    assert abs(report.perplexity_change) < 1e-6


def test_cli_exit_code_zero_on_sampled_text(engines):
    _, good, _ = engines
    proc = subprocess.run(
        [sys.executable, "-m", "llmc.cli", "verify", str(good), "--windows", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PASSED" in proc.stdout
    assert "sampled from the model (seed 1)" in proc.stdout
    assert "no accuracy report in the manifest" in proc.stdout


def test_engine_with_other_weights_fails_the_logits_comparison(engines, capsys):
    from llmc.cli import main

    _, _, bad = engines
    result = verify_engine(bad, VerifyConfig(data=str(SHAKESPEARE), **FAST))
    assert not result.passed
    assert not result.segments[result.logits_segment].passed
    assert all(not s.passed and s.note is None for s in result.segments)  # comparable, wrong
    assert result.segments[result.logits_segment].max_abs_error > 1e-2
    assert result.accuracy.mean_kl > 1e-3 and result.accuracy.top1_agreement < 1.0
    assert main(["verify", str(bad), "--data", str(SHAKESPEARE), "--windows", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "FAIL" in out.split("(logits)")[1].splitlines()[0]


def test_tensor_names_the_exporter_swaps_are_matched_by_value(engines, tmp_path):
    """Gemma 3 computes its RoPE tables in ``set(layer_types)`` order, which follows Python's
    hash seed: an engine built under the other order than verify's has the tables' names
    swapped. Builds and verifies run in processes of their own with chosen hash seeds, so the
    swap does not depend on this process's seed; an engine built under verify's order is the
    control (nothing to re-match)."""
    ckpts, _, _ = engines
    layer_types = ["sliding_attention", "full_attention"]

    def run(seed: int, *args: str) -> str:
        # A cache of its own per seed: a cached export keeps the names of the seed that made it.
        cache = {"XDG_CACHE_HOME": str(tmp_path / f"cache-{seed}")}
        env = {**os.environ, "PYTHONHASHSEED": str(seed), **cache}
        proc = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    def set_order(seed: int) -> str:
        return run(seed, "-c", f"print(list(set({layer_types!r})))")

    verify_seed = 1
    build_seed = next(s for s in range(2, 50) if set_order(s) != set_order(verify_seed))
    engines_by_seed = {seed: tmp_path / f"engine-{seed}" for seed in (verify_seed, build_seed)}
    for seed, engine in engines_by_seed.items():
        build_args = ["--block-size", "4", "--max-seq-len", "64", "-o", str(engine)]
        run(seed, "-m", "llmc.cli", "build", str(ckpts[0]), *build_args)
    # The precondition, by construction: the two orders name the RoPE tables differently.
    names = {
        seed: {n for s in load_plan(engine).segments for n in s.outputs}
        for seed, engine in engines_by_seed.items()
    }
    assert names[verify_seed] != names[build_seed]

    code = (
        "import json, sys; from llmc.compiler.verify.verify import VerifyConfig, verify_engine; "
        f"rs = [verify_engine(e, VerifyConfig(data=sys.argv[1], **{FAST!r})) "
        "for e in sys.argv[2:]]; "
        "print(json.dumps([{'renamed': r.renamed, 'segments': "
        "[[s.passed, s.note] for s in r.segments]} for r in rs]))"
    )
    out = run(verify_seed, "-c", code, str(SHAKESPEARE), *map(str, engines_by_seed.values()))
    control, swapped = json.loads(out.strip().splitlines()[-1])
    assert control["renamed"] == {}, control
    assert swapped["renamed"], swapped  # e.g. {"mul_40": "mul_15"}: the other RoPE table's name
    for result in (control, swapped):
        assert all(passed and note is None for passed, note in result["segments"]), result


def test_checkpoint_with_another_digest_is_refused(engines):
    ckpts, good, _ = engines
    with pytest.raises(VerifyError, match=r"sha256 .*--model"):
        verify_engine(good, VerifyConfig(model=str(ckpts[1]), **FAST))


def test_bad_options_fail_before_the_model_is_loaded(engines, tmp_path):
    _, good, _ = engines
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    missing_model = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(CalibrationDataError, match=r"empty\.txt is empty"):
        verify_engine(good, VerifyConfig(data=str(empty), model=missing_model))
    with pytest.raises(VerifyError, match=r"--seq-len must be in \[2, 64\]"):
        verify_engine(good, VerifyConfig(seq_len=65, model=missing_model))
    with pytest.raises(ModelSourceError, match="no-such-checkpoint"):
        verify_engine(good, VerifyConfig(model=missing_model, **FAST))


def test_an_engine_with_adapter_slots_passes_against_its_base_model(tmp_path):
    """The reference carries the engine's LoRA slots, fed empty: every segment is compared."""
    checkpoint = make_tiny_llama(tmp_path / "ckpt", seed=2, sharp=True)
    engine = tmp_path / "engine"
    config = BuildConfig.of(
        model=str(checkpoint), block_size=4, max_seq_len=64, output=str(engine), enable_lora=True
    )
    build(config)
    assert read_manifest(engine).lora is not None
    result = verify_engine(engine, VerifyConfig(data=str(SHAKESPEARE), **FAST))
    assert result.passed
    for s in result.segments:
        assert s.passed and s.note is None and s.outputs, s
