"""The TensorRT lint's rules from TensorRT 11.1's and onnx-tensorrt's sources, on real
portable stages written by ``llmc build --arch sm90`` (no TensorRT here, so the build stops at
the stage, DESIGN §6): a Gemma-3-shaped (head_dim 256, MQA, a sliding-window layer) and a
Llama-shaped fp8 stage pass; each rule rejects its stage with the defect put back."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import llmc.compiler.backends.tensorrt.lint as lint_mod
import llmc.compiler.backends.tensorrt.lower as lower_mod
from llmc.cli import main
from llmc.compiler.backends.tensorrt.lint import lint_model
from llmc.compiler.backends.tensorrt.plugin_io import PTX_ISA_KEY, set_metadata
from llmc.engine import stage as st
from llmc.engine.gpu import missing_for_build
from llmc.engine.plugin import PLUGIN_ATTRIBUTES, PluginAttributes, plugin_nodes
from llmc.errors import LlmcError
from tests.tiny_models import SHAKESPEARE, make_tiny_llama, train_tokenizer

pytestmark = pytest.mark.skipif(
    not missing_for_build("sm90"), reason="this host can build TensorRT plans"
)


def make_gemma3(out_dir: Path, head_dim: int = 256) -> Path:
    """A 2-layer Gemma 3 text model shaped like Gemma 3 270M's attention: 4 heads of 256 over
    1 KV head (MQA), a sliding-window layer and a global one; tiny random weights."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(5)
    cfg = Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=head_dim, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    Gemma3ForCausalLM(cfg).eval().save_pretrained(out_dir, safe_serialization=True)
    train_tokenizer(out_dir)
    return out_dir


def _build(root: Path, ckpt: Path, name: str, *options: str) -> tuple[int, str, Path]:
    """``llmc build CKPT --arch sm90 OPTIONS`` -> (exit code, stderr, stage dir)."""
    data = root / "calib.txt"
    if not data.exists():
        data.write_text(SHAKESPEARE.read_text()[:20_000])
    stage = root / name
    args = ["build", str(ckpt), "--arch", "sm90", "--max-seq-len", "128", *options]
    args += ["--calib-data", str(data), "--calib-samples", "2", "--calib-seq-len", "32"]
    args += ["--cache-dir", str(root / "cache"), "-o", str(stage)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    return code, err.getvalue(), stage


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> dict[str, Path]:
    """{name: stage dir} of the fp8 sm90 stages (Gemma-3-shaped and Llama-shaped) and a
    float32 Gemma-3-shaped one."""
    root = tmp_path_factory.mktemp("lint_rules")
    gemma = make_gemma3(root / "ckpt-gemma")
    llama = make_tiny_llama(root / "ckpt-llama", seed=3)
    out = {}
    for name, ckpt, options in [
        ("gemma", gemma, ("--quant", "fp8")),
        ("llama", llama, ("--quant", "fp8")),
    ]:
        code, err, stage = _build(root, ckpt, name, *options)
        assert code == 2 and "portable stage written to" in err, err[-2000:]
        out[name] = stage
    # A float32 stage of head dim 512 fails the lint ("smem") and the build refuses to write
    # it; written here with the refusal switched off, to check the rule on the file.
    wide = make_gemma3(root / "ckpt-gemma512", head_dim=512)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lint_mod, "raise_on_errors", lambda report, what: None)
        code, err, out["wide-float32"] = _build(root, wide, "wide-float32", "--dtype", "float32")
    assert code == 2 and "portable stage written to" in err, err[-2000:]
    return out


def _load(stage: Path) -> onnx.ModelProto:
    return onnx.load(str(stage / st.MODEL_FILE), load_external_data=False)


def _lint(model: onnx.ModelProto, stage: Path):
    return lint_model(model, "sm90", stage)


def _errors(report) -> list[tuple[str, str | None]]:
    return [(f.check, f.node) for f in report.errors]


@pytest.mark.parametrize("name", ["gemma", "llama"])
def test_fp8_stages_pass_with_what_the_plugin_declares(stages, name):
    model = _load(stages[name])
    report = _lint(model, stages[name])
    assert report.passed, report.format()
    assert report.warnings == []
    m = st.read_stage(stages[name])
    assert m.lint["passed"] and (m.quant, m.dtype, m.target) == ("fp8", "bfloat16", "sm90")
    nodes = plugin_nodes(model)
    outputs = [o.name for o in model.graph.output]
    assert outputs[0] == "logits"
    for n in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["aot"] == 1 and {f for f, _ in PLUGIN_ATTRIBUTES} <= set(attrs)
        assert list(n.output[1:]) == [f"{c}.updated" for c in n.input[3:5]]
        assert set(n.output[1:]) <= set(outputs)
    assert {p.key: p.value for p in model.metadata_props}[PTX_ISA_KEY] == "8.7"
    if name == "gemma":  # Gemma 3's attention shape
        windows = [helper.get_attribute_value(a) for n in nodes for a in n.attribute
                   if a.name == "sliding_window"]  # fmt: skip
        heads = {
            (a.name, a.i) for a in nodes[0].attribute if a.name in ("head_dim", "num_kv_heads")
        }
        assert windows == [16, 0] and heads == {("head_dim", 256), ("num_kv_heads", 1)}
    # 8-bit weight-only vocabulary projection: per-channel INT8 (TensorRT blocks FP4/FP8/INT4)
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and "lm_head" in n.name]
    assert len(dq) == 1 and [(a.name, a.i) for a in dq[0].attribute] == [("axis", 1)]


def test_outputs_rule_rejects_one_output_nodes(stages):
    model = _load(stages["llama"])  # as export writes them: one output, no cache outputs
    for n in plugin_nodes(model):
        del n.output[1:]
    kept = [o for o in model.graph.output if not o.name.endswith(".updated")]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    report = _lint(model, stages["llama"])
    names = [n.name for n in plugin_nodes(model)]
    assert _errors(report) == [("outputs", n) for n in names]
    assert "has 1 outputs but the TensorRT plugin declares 3" in report.errors[0].message


def test_alias_rule_rejects_caches_that_are_no_graph_outputs(stages):
    model = _load(stages["gemma"])
    kept = [o for o in model.graph.output if not o.name.endswith(".updated")]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    report = _lint(model, stages["gemma"])
    names = [n.name for n in plugin_nodes(model)]
    assert _errors(report) == [("alias", n) for n in names for _ in range(2)]
    assert "'key_cache.0.updated' aliases cache 'key_cache.0' but is not a graph output" in (
        report.errors[0].message
    )


def test_aot_rule_rejects_nodes_that_do_not_choose(stages):
    model = _load(stages["llama"])
    for n in plugin_nodes(model):
        kept = [a for a in n.attribute if a.name != "aot"]
        del n.attribute[:]
        n.attribute.extend(kept)
    report = _lint(model, stages["llama"])
    assert {c for c, _ in _errors(report)} == {"aot"} and len(report.errors) == 2
    assert "both AOT and JIT implementations" in report.errors[0].message


def test_fields_rule_rejects_a_missing_optional_attribute(stages):
    model = _load(stages["llama"])  # k_scale is optional in the schema; QDP has no defaults
    n = plugin_nodes(model)[1]
    kept = [a for a in n.attribute if a.name != "k_scale"]
    del n.attribute[:]
    n.attribute.extend(kept)
    report = _lint(model, stages["llama"])
    assert _errors(report) == [("fields", n.name)]
    assert report.errors[0].message == "lacks plugin field(s) k_scale (QDP has no defaults)"


def test_strings_rule_rejects_a_plugin_that_keeps_the_nul(stages, monkeypatch):
    def unstripped(cls, *values):  # a plugin that keeps QDP's decoded string as is
        kinds = [kind for _, kind in PLUGIN_ATTRIBUTES]
        attributes = cls(*(kind(v) for kind, v in zip(kinds, values, strict=True)))
        attributes.check()
        return attributes

    model = _load(stages["gemma"])
    assert _lint(model, stages["gemma"]).passed
    monkeypatch.setattr(PluginAttributes, "from_fields", classmethod(unstripped))
    report = _lint(model, stages["gemma"])
    assert {c for c, _ in _errors(report)} == {"strings"} and len(report.errors) == 2
    message = report.errors[0].message
    assert "kv_cache_dtype='auto' reaches the plugin as 'auto\\x00'" in message
    assert "kv_cache_dtype must be one of auto, fp8, int8, got 'auto\\x00'" in message


def test_block_dq_rule_rejects_block_wise_int8(stages):
    model = _load(stages["llama"])  # the lm_head DQ put back to block-wise INT8
    dq = next(
        n for n in model.graph.node if n.op_type == "DequantizeLinear" and "lm_head" in n.name
    )
    k = 64  # hidden size: the projection's input channels
    n_out = next(t for t in model.graph.initializer if t.name == dq.input[0]).dims[1]
    values = np.full(k // 16 * n_out, 0.01, np.float32)
    scale = helper.make_tensor("lm_head.blocks", TensorProto.BFLOAT16, [k // 16, n_out], values)
    model.graph.initializer.append(scale)
    dq.input[1] = scale.name
    del dq.attribute[:]
    dq.attribute.extend([helper.make_attribute("axis", 0), helper.make_attribute("block_size", 16)])
    report = _lint(model, stages["llama"])
    assert _errors(report) == [("block-dq", dq.name)]
    assert "TensorRT quantizes block-wise only INT4, FP8, FP4" in report.errors[0].message


def test_smem_rule_rejects_a_kernel_above_48_kb_without_opt_in(stages):
    model = _load(stages["wide-float32"])  # head_dim 512 in float32: no tile fits 48 KB
    recorded = st.read_stage(stages["wide-float32"]).lint
    assert not recorded["passed"] and {f["check"] for f in recorded["findings"]} == {"smem"}
    report = _lint(model, stages["wide-float32"])
    names = [n.name for n in plugin_nodes(model)]
    assert _errors(report) == [("smem", n) for n in names]
    assert "an AOT launch has no opt-in above 48 KB" in report.errors[0].message
    for n in plugin_nodes(model):  # JIT: Triton's launcher opts in up to 227 KB on sm90
        next(a for a in n.attribute if a.name == "aot").i = 0
    assert _lint(model, stages["wide-float32"]).passed


def test_ptx_rule_rejects_an_unpinned_or_too_new_isa(stages):
    model = _load(stages["llama"])
    set_metadata(model, PTX_ISA_KEY, "9.4")  # what triton 3.9 writes for sm_90a unpinned
    report = _lint(model, stages["llama"])
    assert _errors(report) == [("ptx", None)]
    assert "PTX ISA 9.4 is newer than 8.8" in report.errors[0].message
    del model.metadata_props[:]
    assert (
        "does not pin the AOT kernel's PTX ISA" in _lint(model, stages["llama"]).errors[0].message
    )
    set_metadata(model, PTX_ISA_KEY, "7.8")
    assert (
        "PTX ISA 7.8 predates sm90 (needs 8.0)" in _lint(model, stages["llama"]).errors[0].message
    )


def test_build_fails_on_a_lint_finding_before_writing_the_stage(tmp_path, monkeypatch):
    ckpt = make_tiny_llama(tmp_path / "ckpt", seed=3)
    monkeypatch.setattr(lower_mod, "rewrite_plugin_nodes", lambda model: 0)  # export's nodes
    code, err, stage = _build(tmp_path, ckpt, "stage")
    assert code == 2 and "TensorRTLintError" in err and "[outputs]" in err
    assert not stage.exists()


def test_plugin_reads_nul_terminated_strings():
    attributes = PluginAttributes.from_fields(
        4, 1, 256, 0.0625, 512, 0.0, 16, 0, "fp8\x00", 0.5, 0.25
    )
    assert attributes.kv_cache_dtype == "fp8"
    with pytest.raises(LlmcError, match="takes 11 attributes"):
        PluginAttributes.from_fields(4, 1, 256)
