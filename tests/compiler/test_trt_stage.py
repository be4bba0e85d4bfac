"""The no-GPU path of ``llmc build --arch sm90``: the real CLI writes the portable stage, exits
with code 2 naming what is missing, and ``--from`` accepts the stage up to where TensorRT is
needed. Precisions the target lacks fail before any work."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import numpy as np
import onnx
import pytest

from llmc.calibration.stats_cache import StatsCache, load_stats
from llmc.cli import main
from llmc.engine import stage as st
from llmc.engine.gpu import missing_for_build
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3

pytestmark = pytest.mark.skipif(
    not missing_for_build("sm90"), reason="this host can build TensorRT plans"
)


@pytest.fixture(scope="module")
def int8_stage(tmp_path_factory):
    """(root, checkpoint, stage dir, exit code, stderr) of one int8 sm90 build via the CLI."""
    root = tmp_path_factory.mktemp("trt_stage")
    ckpt = make_tiny_gemma3(root / "ckpt", seed=4)
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:40_000])
    stage = root / "stage"
    args = ["build", str(ckpt), "--arch", "sm90", "--quant", "int8", "--block-size", "8"]
    args += ["--max-seq-len", "128", "--calib-data", str(data), "--calib-samples", "3"]
    args += ["--calib-seq-len", "32", "--cache-dir", str(root / "cache"), "-o", str(stage)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    return root, ckpt, stage, code, err.getvalue()


def test_build_writes_stage_and_exits_2_naming_what_is_missing(int8_stage, capsys):
    root, ckpt, stage, code, err = int8_stage
    assert code == 2
    assert "portable stage written to" in err and str(stage) in err
    assert "the tensorrt Python module" in err
    assert "a GPU of compute capability 9.0 (found: no CUDA GPU)" in err
    assert f"llmc build --from {stage} --arch sm90" in err
    m = st.read_stage(stage)  # verifies every file's sha256
    assert (m.target, m.quant, m.dtype, m.kv_cache_dtype) == (
        "sm90",
        "int8",
        "bfloat16",
        "bfloat16",
    )
    assert m.build_config["target"]["arch"] == "sm90"
    assert m.build_config["destination"]["output"] is None
    assert m.lint["passed"] is True and m.lint["errors"] == 0
    assert sum(m.quantization["counts"].values()) == len(m.quantization["modules"]) > 0
    # calibration statistics travel with the stage: the cached ones, without the Gram matrices
    cached = [d for d in (root / "cache" / "calibration").iterdir() if d.is_dir()]
    assert len(cached) == 1 and m.calibration_stats == st.CALIBRATION_FILE
    full, staged = (
        StatsCache(cached[0]).load_all(gram=True),
        load_stats(stage / st.CALIBRATION_FILE),
    )
    assert any(s.gram is not None for s in full.values())  # GPTQ's, in the cache
    assert staged.keys() == full.keys()
    for key, s in staged.items():
        assert s.gram is None and s.rows == full[key].rows
        for a, b in ((s.channel_absmax, full[key].channel_absmax), (s.sample, full[key].sample)):
            np.testing.assert_array_equal(a, b)
    assert {"model.onnx", "model.onnx.data", "generation_config.json"} <= set(m.files)
    graph = onnx.load(str(stage / st.MODEL_FILE))
    assert [o.domain for o in graph.opset_import if o.domain] == ["llmc"]
    plugins = [n for n in graph.graph.node if n.op_type == "PagedAttention"]
    assert len(plugins) == 2 and all(p.domain == "llmc" for p in plugins)
    assert not any(n.op_type.startswith(("MatMulInteger", "MatMulNBits")) for n in graph.graph.node)

    # --from: checks the stage, lints it, then needs TensorRT: exit 2 again
    code = main(["build", "--from", str(stage), "--arch", "sm90", "--timing-cache", "t.cache"])
    err = capsys.readouterr().err
    assert code == 2 and "TensorRTUnavailableError" in err and "written" not in err
    assert f"portable stage {stage} (TensorRT lint passed)" in err

    # inspect: exit 0, lint run now
    assert main(["inspect", str(stage)]) == 0
    out = capsys.readouterr().out
    assert "stage" in out and "TensorRT lint passed" in out and "int8_w8a8" in out


def test_from_refuses_mismatched_or_damaged_stages(int8_stage, capsys):
    _, ckpt, stage, _, _ = int8_stage
    for extra, message in [
        (["--arch", "sm89"], "the stage was built with --arch sm90 but --arch sm89 was asked"),
        (["--quant", "int4"], "the stage was built with --quant int8 but --quant int4"),
        (["--block-size", "16"], "--block-size cannot change when finishing a stage"),
    ]:
        assert main(["build", "--from", str(stage), *extra]) == 2
        assert message in capsys.readouterr().err
    data = stage / "model.onnx.data"
    original = data.read_bytes()
    try:
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 1
        data.write_bytes(bytes(flipped))
        assert main(["build", "--from", str(stage), "--arch", "sm90"]) == 2
        err = capsys.readouterr().err
        assert "StageError" in err and "model.onnx.data differs from its digest" in err
    finally:
        data.write_bytes(original)
    assert main(["build", "--from", str(ckpt)]) == 2
    assert "is not a portable stage (no stage.json)" in capsys.readouterr().err


def test_lint_failure_in_a_stage_is_reported_by_from_and_inspect(int8_stage, tmp_path, capsys):
    stage = int8_stage[2]
    broken = tmp_path / "broken"
    shutil.copytree(stage, broken)
    model = onnx.load(str(broken / st.MODEL_FILE), load_external_data=False)
    zp = next(n for n in model.graph.node if n.op_type == "QuantizeLinear").input[2]
    t = next(t for t in model.graph.initializer if t.name == zp)
    t.CopyFrom(onnx.numpy_helper.from_array(np.array(5, np.int8), zp))
    onnx.save(model, str(broken / st.MODEL_FILE))
    meta = json.loads((broken / st.STAGE_NAME).read_text())
    from llmc.engine.manifest import file_digests

    meta["files"] = {k: v for k, v in file_digests(broken).items() if k != st.STAGE_NAME}
    (broken / st.STAGE_NAME).write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["build", "--from", str(broken), "--arch", "sm90"]) == 2
    err = capsys.readouterr().err
    assert "TensorRTLintError" in err and "asymmetric" in err and "max |zp| = 5" in err
    assert main(["inspect", str(broken)]) == 1
    assert "TensorRT lint FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--arch", "sm86", "--quant", "fp8"], "--quant fp8 needs FP8 tensor cores (sm89"),
        (["--arch", "sm80", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8 needs FP8"),
        (["--arch", "cpu", "--dtype", "float16"], "--dtype float16 needs a GPU target"),
        (["--arch", "sm90", "--builder-opt-level", "9"], "--builder-opt-level must be 0-5"),
        (["--arch", "sm90", "--quant", "int4", "--int4-block-size", "32"], "blocks of 64 or 128"),
        (["--arch", "sm90", "--hardware-compat", "ampere+"], "ampere+ cannot hold the paged-"),
    ],
)
def test_precision_the_target_lacks_fails_before_any_work(tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    # The model does not exist: only a check of the options can fail first.
    assert main(["build", str(tmp_path / "no-such-model"), *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "ModelSourceError" not in err and not out.exists()
