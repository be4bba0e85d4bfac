"""The main job on tiny random-weight models: build a CPU engine, generate, compare with HF."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine.plugin import FPMATH_ATTRIBUTE, REQUIRED_ATTRIBUTES, plugin_nodes
from llmc.errors import BuildConfigError, EngineCorruptError, EngineMismatchError
from llmc.plugins.paged_attention import ort_op
from llmc.runtime.engine import LLMEngine
from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

PROMPTS = ["To be, or not to be", "ROMEO:", "First Citizen:\nBefore we proceed", "What is"]
NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    """(checkpoint dir, engine dir) of a tiny model built for cpu with 4-token blocks (so the
    prompts cross block boundaries and the Gemma 3 window of 8 is exceeded)."""
    root = tmp_path_factory.mktemp(request.param)
    make = make_tiny_llama if request.param == "llama" else make_tiny_gemma3
    ckpt = make(root / "ckpt", sharp=True)
    config = BuildConfig.of(
        model=str(ckpt), block_size=4, max_seq_len=128, output=str(root / "engine")
    )
    result = build(config)
    return request.param, ckpt, result


def hf_greedy(ckpt: Path, prompt_ids: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    return out[0, len(prompt_ids) :].tolist()


def test_engine_greedy_equals_hf(tiny):
    _, ckpt, result = tiny
    tok = AutoTokenizer.from_pretrained(ckpt)
    llm = LLM(result.engine_dir)
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = tok(prompt).input_ids
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == hf_greedy(ckpt, ids, NEW_TOKENS), prompt
        assert out.outputs[0].text == tok.decode(out.outputs[0].token_ids, skip_special_tokens=True)


def test_staggered_arrivals_equal_alone(tiny):
    """In-flight batching: requests join a running batch at different steps and leave when done;
    every request's tokens equal its tokens when run alone."""
    _, _, result = tiny
    engine = LLMEngine.from_engine_dir(result.engine_dir)
    tok = engine.tokenizer
    alone = {}
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"alone-{i}", tok(p).input_ids, GREEDY)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    alone[i] = out.outputs[0].token_ids
    together: dict[int, list[int]] = {}
    pending = list(enumerate(PROMPTS))
    step = 0
    max_running = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # a new request every third step
            i, p = pending.pop(0)
            engine.add_request(f"together-{i}", tok(p).input_ids, GREEDY)
        outs = engine.step()
        max_running = max(max_running, len(outs))
        for out in outs:
            if out.finished:
                together[int(out.request_id.split("-")[1])] = out.outputs[0].token_ids
        step += 1
    assert max_running > 1  # the requests really shared steps
    assert together == alone


def test_graph_has_one_plugin_per_layer_and_fused_ops(tiny):
    name, _, result = tiny
    report = result.pass_report
    # Llama: 2 norms per layer + final = 5; Gemma 3: 4 norms + q/k norms per layer + final = 13.
    assert report["rms_norm"] == {"llama": 5, "gemma3": 13}[name]
    assert report["rotary_embedding"] == 4  # q and k in each of 2 layers
    assert report["head_layout"] == 4  # the same q and k kept [B, S, H, D]
    assert report["parallel_matmul"] == 4  # QKV and gate/up in each of 2 layers
    assert result.optimized_ops["Split"] >= 4
    plan = json.loads((result.engine_dir / "plan.json").read_text())
    assert [p["layer_idx"] for p in plan["plugins"]] == [0, 1]
    windows = [p["sliding_window"] for p in plan["plugins"]]
    assert windows == {"llama": [0, 0], "gemma3": [8, 0]}[name]
    assert [p["fpmath_mode"] for p in plan["plugins"]] == ["strict"] * 2  # float32: no bf16
    # each layer's residual Adds go into the norm that follows them (Skip...); the rest run on
    # SimplifiedLayerNormalization, none on RMSNormalization
    skip = result.optimized_ops.get("SkipSimplifiedLayerNormalization", 0)
    assert skip == {"llama": 4, "gemma3": 4}[name]
    plain = result.optimized_ops.get("SimplifiedLayerNormalization", 0)
    assert plain + skip == report["rms_norm"]
    assert "RMSNormalization" not in result.optimized_ops
    # the single graph runs every one of them on llmc's kernels where the op library is built:
    # Gemma 3's q/k norms inside QKVRoPE with the rotary embedding, one per layer, and its
    # post-attention / post-feedforward norms inside the residual add and norm after them
    single = onnx.load(str(result.engine_dir / "engine.onnx"), load_external_data=False)
    llmc_ops = Counter(n.op_type for n in single.graph.node if n.domain == "llmc")
    if ort_op.library_path() is not None:
        assert llmc_ops["QKVRoPE"] == {"llama": 0, "gemma3": 2}[name]
        fused = llmc_ops["NormSkipRMSNorm"]
        assert fused == {"llama": 0, "gemma3": 4}[name]
        assert llmc_ops["SkipRMSNorm"] + fused == skip
        assert llmc_ops["RMSNorm"] + fused + 2 * llmc_ops["QKVRoPE"] == plain
        assert (
            result.optimized_ops.get("SkipRMSNorm", 0)
            + result.optimized_ops.get("NormSkipRMSNorm", 0)
            == skip
        )


def test_exported_plugin_nodes_carry_the_contract(tiny):
    _, ckpt, _ = tiny
    from llmc.compiler.frontend.model_source import load_model, resolve_model
    from llmc.compiler.frontend.onnx_export import export_onnx

    proto = export_onnx(load_model(resolve_model(str(ckpt))), block_size=4)
    nodes = plugin_nodes(proto)
    assert len(nodes) == 2
    for node in nodes:
        attrs = {a.name for a in node.attribute}
        assert set(REQUIRED_ATTRIBUTES) <= attrs
        assert FPMATH_ATTRIBUTE not in attrs  # the CPU lowering's, never the export's
        assert (
            onnx.helper.get_attribute_value(
                next(a for a in node.attribute if a.name == "plugin_namespace")
            )
            == b"llmc"
        )
    assert [i.name for i in proto.graph.output] == ["logits"]


def test_mismatched_engine_is_refused_before_loading(tiny, tmp_path):
    _, _, result = tiny
    import shutil

    copy = tmp_path / "engine"
    shutil.copytree(result.engine_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["target"] = "sm90"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    # Corrupt a segment too: the manifest check must fire first, before any file is read.
    seg = copy / "segments" / "segment_000.onnx"
    seg.write_bytes(b"not onnx")
    with pytest.raises(EngineMismatchError, match=r"sm90.*--arch cpu"):
        LLM(copy)
    manifest["target"] = "cpu"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineCorruptError, match="segment_000.onnx"):
        LLM(copy)


def test_bad_build_options_fail_before_work(tmp_path):
    with pytest.raises(BuildConfigError, match="--dtype"):
        BuildConfig.from_sources(None, {"dtype": "float8"})
    with pytest.raises(BuildConfigError, match="unknown build option"):
        BuildConfig.from_sources(None, {"max_seq": 3})
    yaml_file = tmp_path / "b.yaml"
    yaml_file.write_text("max-seq-len: 512\nblock_size: 8\n")
    config = BuildConfig.from_sources(str(yaml_file), {"block_size": 32})
    assert (config.export.max_seq_len, config.export.block_size) == (
        512,
        32,
    )  # the command line wins


def test_bfloat16_engine_runs_on_openvino_close_to_float32(tmp_path):
    """``--dtype bfloat16``: the same graph with bf16 compute, on the OpenVINO EP or, where the
    EP exposes no device (AMD CPUs), on OpenVINO's own runtime. Its logits stay within bf16
    error of the float32 engine's and it is recorded as such in the manifest."""
    from llmc.engine.isa import detect_host_isa
    from llmc.runtime.runners.execution_provider import openvino_cpu_devices
    from llmc.runtime.runners.openvino_runner import openvino_available

    if "avx512-bf16" not in detect_host_isa().features:
        pytest.skip("this host does not run AVX-512 BF16")
    devices, why_not = openvino_cpu_devices()
    if not devices and openvino_available() is not None:
        pytest.skip(f"{why_not}; {openvino_available()}")
    ckpt = make_tiny_gemma3(tmp_path / "ckpt", sharp=True)
    engines = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        build(
            BuildConfig.of(
                model=str(ckpt), dtype=dtype, block_size=4, max_seq_len=64, output=str(out)
            )
        )
        engines[dtype] = LLMEngine.from_engine_dir(out)
    manifest = json.loads((tmp_path / "bfloat16" / "manifest.json").read_text())
    # Where the EP has a CPU device both OpenVINO paths run bf16 and the faster one is chosen
    # (on an Intel host either wins, by timing); elsewhere only OpenVINO's runtime runs.
    expected = {"OpenVINOExecutionProvider", "OpenVINORuntime"} if devices else {"OpenVINORuntime"}
    assert manifest["execution_provider"] in expected
    assert manifest["execution_precision"] == "bf16"
    # bf16 compute is reported against the float32 graph, on the provider that ships.
    accuracy = manifest["accuracy_report"]
    assert 0 < accuracy["mean_kl"] < 0.05 and 0.8 <= accuracy["top1_agreement"] < 1.0
    assert "avx512-bf16" in manifest["isa"]
    import numpy as np

    from llmc.runtime.runners.step_inputs import StepInputs

    n = 11
    step = StepInputs(
        input_ids=np.arange(10, 10 + n, dtype=np.int64),
        positions=np.arange(n, dtype=np.int64),
        seq_lens=np.array([n], np.int32),
        query_start_loc=np.array([0, n], np.int32),
        block_tables=np.array([[0, 1, 2]], np.int32),
        slot_mapping=np.arange(n, dtype=np.int64),
        logits_indices=np.arange(n, dtype=np.int64),
    )
    f32 = engines["float32"].runner.execute(step)
    bf16 = engines["bfloat16"].runner.execute(step)
    rel = np.abs(bf16 - f32).max() / np.abs(f32).max()
    assert 0 < rel < 0.1  # not bit-identical (bf16 really ran), within bf16 error
    assert (bf16.argmax(-1) == f32.argmax(-1)).mean() >= 0.8


def test_build_chose_the_provider_by_measurement(tiny, capsys):
    """The manifest records the measured CPU EP, the OpenVINO EP's real reason on a host where
    it exposes no CPU device, and ``llmc inspect`` prints both."""
    from llmc.cli import main
    from llmc.compiler.backends.onnxruntime.provider_choice import ProviderSelection
    from llmc.engine.manifest import read_manifest
    from llmc.runtime.runners.execution_provider import openvino_cpu_devices

    _, _, result = tiny
    manifest = read_manifest(result.engine_dir)
    selection = ProviderSelection.from_dict(manifest.provider_selection)
    assert (manifest.execution_provider, manifest.execution_precision) == (
        "CPUExecutionProvider",
        "f32",
    )
    cpu, openvino = selection.candidates
    assert (selection.mode, selection.provider, cpu.status) == ("auto", cpu.provider, "accepted")
    # max_seq_len 128: a 127-token prefill; max_batch 16.
    assert list(cpu.step_ms) == ["prefill_127", "decode_1", "decode_16"]
    assert all(t > 0 for t in cpu.step_ms.values()) and cpu.max_rel_diff == 0.0
    assert openvino.provider == "OpenVINOExecutionProvider"
    devices, reason = openvino_cpu_devices()
    if not devices:
        assert (openvino.status, openvino.reason) == ("unavailable", reason)
    assert main(["inspect", str(result.engine_dir)]) == 0
    out = capsys.readouterr().out
    assert "provider selection (--execution-provider auto):" in out
    assert "CPUExecutionProvider f32: accepted, score" in out


def test_probe_steps_are_what_a_real_prefill_and_decode_compute(tiny):
    """On the real CPU EP runner: the decode at position P equals a P+1-token prefill's last
    logits, and with P a multiple of the block size every decode sequence (shared prefix blocks,
    a private block for position P) equals it too. ``--execution-provider cpu`` measures only the
    CPU EP."""
    import numpy as np

    from llmc.compiler.backends.onnxruntime.provider_choice import select_provider
    from llmc.compiler.backends.onnxruntime.provider_timing import probe_steps, time_steps
    from llmc.runtime.runners.ort_runner import OrtRunner
    from llmc.runtime.runners.step_inputs import single_prefill

    _, _, result = tiny
    probe = probe_steps(
        block_size=4, vocab_size=512, max_seq_len=65, max_num_tokens=64, max_batch=5
    )
    assert list(probe.steps) == ["prefill_64", "decode_1", "decode_5"]
    logits, step_ms = time_steps(OrtRunner(result.engine_dir, probe.num_blocks), probe, repeats=1)
    assert list(step_ms) == list(probe.steps)
    warmup_only, none = time_steps(OrtRunner(result.engine_dir, probe.num_blocks), probe, 0)
    assert none == {} and all(np.array_equal(logits[k], warmup_only[k]) for k in logits)
    prefill, decode = probe.steps["prefill_64"], probe.steps["decode_1"]
    ids = np.concatenate([prefill.input_ids, decode.input_ids])
    whole = OrtRunner(result.engine_dir, 17).execute(single_prefill(ids, 4, all_logits=False))
    np.testing.assert_allclose(logits["decode_1"], whole, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits["decode_5"], np.repeat(whole, 5, 0), rtol=1e-4, atol=1e-4)
    assert not np.allclose(logits["decode_1"], logits["prefill_64"], atol=1e-3)
    selection = select_provider(result.engine_dir, "float32", "cpu", probe)
    assert [c.provider for c in selection.candidates] == ["CPUExecutionProvider"]
    assert selection.candidates[0].status == "accepted"


def test_single_graph_and_segments_run_the_same_step(tiny):
    """engine.onnx (the custom op inside ORT) and the segments (the ctypes kernel between ORT
    runs) are two forms of the same optimized nodes, but for the norms, which the single graph
    runs on llmc's kernel (norm_rewrite: another float32 summation order): equal logits and
    caches to float32 rounding over a prefill of two sequences, then a decode of both, crossing
    blocks."""
    import numpy as np

    from llmc.runtime.runners.ort_runner import OrtRunner
    from llmc.runtime.runners.step_inputs import StepInputs

    _, _, result = tiny
    graph = OrtRunner(result.engine_dir, 12)
    segments = OrtRunner(result.engine_dir, 12, single_graph=False)
    assert graph.single_graph and not segments.single_graph

    def step(lens: list[int], new: list[int]) -> StepInputs:
        tables = np.array([[1, 5, 3, 0], [2, 4, 7, 9]], np.int32)
        pos = np.concatenate([np.arange(n - k, n) for n, k in zip(lens, new, strict=True)])
        seq = np.repeat([0, 1], new)
        return StepInputs(
            input_ids=(pos * 13 + seq * 5 + 7).astype(np.int64) % 256,
            positions=pos.astype(np.int64),
            seq_lens=np.array(lens, np.int32),
            query_start_loc=np.array([0, *np.cumsum(new)], np.int32),
            block_tables=tables,
            slot_mapping=(tables[seq, pos // 4] * 4 + pos % 4).astype(np.int64),
            logits_indices=(np.cumsum(new) - 1).astype(np.int64),
        )

    def same(a: np.ndarray, b: np.ndarray) -> None:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))

    for s in (step([9, 6], [9, 6]), step([10, 7], [1, 1])):
        same(graph.execute(s), segments.execute(s))
        for name, cache in graph.kv_caches.items():
            same(cache, segments.kv_caches[name])
    assert any(c.any() for c in graph.kv_caches.values())
